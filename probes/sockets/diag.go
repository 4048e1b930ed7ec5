//go:build linux

package sockets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// napd's own sock_diag dump (linux/sock_diag.h, linux/inet_diag.h): one
// SOCK_DIAG_BY_FAMILY request per address family, asking for the TCP
// sockets in the states wanted holds, with their tcp_info. The kernel skips
// every other socket before it builds a message: a host's tens of
// thousands of TIME_WAIT sockets cost nothing.
const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	inetDiagInfo     = 2  // INET_DIAG_INFO: the socket's struct tcp_info
	sizeofDiagReq    = 56 // struct inet_diag_req_v2
	sizeofDiagMsg    = 72 // struct inet_diag_msg
	// tcpi_bytes_acked's offset in struct tcp_info (linux/tcp.h; Linux
	// 4.1 and later, an older kernel's shorter tcp_info leaves it 0).
	tcpInfoBytesAcked = 120
	// A dump's datagrams are at most 32 KiB (netlink_recvmsg caps
	// max_recvmsg_len there).
	diagBufSize = 64 << 10
)

// errDumpInterrupted: the socket table changed during the dump
// (NLM_F_DUMP_INTR), which may then miss or repeat sockets.
var errDumpInterrupted = errors.New("sock_diag dump interrupted")

// readNetlink dumps both families over one NETLINK_SOCK_DIAG socket. A dump
// the kernel interrupted is read again once; a second failure falls back.
func readNetlink() ([]Socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, diagBufSize)
	var out []Socket
	seq := uint32(0)
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		n := len(out)
		for try := 0; ; try++ {
			seq++
			out, err = dumpFamily(fd, buf, family, seq, out[:n])
			if !errors.Is(err, errDumpInterrupted) || try == 1 {
				break
			}
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dumpFamily sends one dump request and appends what it answers to out.
func dumpFamily(fd int, buf []byte, family uint8, seq uint32, out []Socket) ([]Socket, error) {
	if err := unix.Sendto(fd, diagRequest(family, wanted, seq), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return out, fmt.Errorf("sock_diag request: %w", err)
	}
	interrupted := false
	for {
		n, _, flags, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("sock_diag answer: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return out, errors.New("sock_diag answer: truncated datagram")
		}
		var d diagDump
		out, d, err = parseDiag(buf[:n], seq, out)
		if err != nil {
			return out, fmt.Errorf("sock_diag answer: %w", err)
		}
		interrupted = interrupted || d.interrupted
		if d.done {
			if interrupted {
				return out, errDumpInterrupted
			}
			return out, nil
		}
	}
}

// diagRequest is a netlink message asking for a dump of family's TCP
// sockets in the states of the bit mask states (1 << TCP state), each
// with its tcp_info.
func diagRequest(family uint8, states uint32, seq uint32) []byte {
	ne := binary.NativeEndian
	b := make([]byte, unix.NLMSG_HDRLEN+sizeofDiagReq)
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], sockDiagByFamily)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], seq) // port ID 0: the kernel fills in ours
	r := b[unix.NLMSG_HDRLEN:]
	r[0], r[1], r[2] = family, unix.IPPROTO_TCP, 1<<(inetDiagInfo-1)
	ne.PutUint32(r[4:], states) // the socket ID that follows stays zero: any
	return b
}

// diagDump says what one datagram of a dump said about the whole.
type diagDump struct {
	done        bool // NLMSG_DONE: the dump ended
	interrupted bool // NLM_F_DUMP_INTR on a message
}

// parseDiag reads one datagram of a sock_diag dump: netlink messages, each
// a struct inet_diag_msg and its attributes, up to NLMSG_DONE, and appends
// the sockets to out. Messages of another sequence number, a kernel error,
// and anything malformed are errors.
func parseDiag(b []byte, seq uint32, out []Socket) ([]Socket, diagDump, error) {
	ne := binary.NativeEndian
	var d diagDump
	for len(b) > 0 {
		if len(b) < unix.NLMSG_HDRLEN {
			return out, d, fmt.Errorf("netlink header: %d bytes left", len(b))
		}
		size := int(ne.Uint32(b[0:]))
		typ, flags, mseq := ne.Uint16(b[4:]), ne.Uint16(b[6:]), ne.Uint32(b[8:])
		if size < unix.NLMSG_HDRLEN || size > len(b) {
			return out, d, fmt.Errorf("netlink message of %d bytes in %d", size, len(b))
		}
		if mseq != seq {
			return out, d, fmt.Errorf("netlink message of sequence %d, want %d", mseq, seq)
		}
		payload := b[unix.NLMSG_HDRLEN:size]
		b = b[min(align4(size), len(b)):]
		d.interrupted = d.interrupted || flags&unix.NLM_F_DUMP_INTR != 0
		switch typ {
		case unix.NLMSG_DONE:
			// A dump that failed midway ends with a negative errno here.
			if len(payload) >= 4 && int32(ne.Uint32(payload)) < 0 {
				return out, d, syscall.Errno(-int32(ne.Uint32(payload)))
			}
			d.done = true
			return out, d, nil
		case unix.NLMSG_ERROR:
			if len(payload) < 4 {
				return out, d, errors.New("short netlink error")
			}
			if e := int32(ne.Uint32(payload)); e < 0 {
				return out, d, syscall.Errno(-e)
			}
		case sockDiagByFamily:
			s, err := parseDiagMsg(payload)
			if err != nil {
				return out, d, err
			}
			out = append(out, s)
		default:
			return out, d, fmt.Errorf("netlink message of type %d", typ)
		}
	}
	return out, d, nil
}

// parseDiagMsg reads a struct inet_diag_msg and its attributes:
//
//	u8 family, state, timer, retrans; sockid {be16 sport, dport;
//	be32 src[4], dst[4]; u32 if, cookie[2]}; u32 expires, rqueue, wqueue,
//	uid, inode; then rtattrs, INET_DIAG_INFO among them.
func parseDiagMsg(p []byte) (Socket, error) {
	ne := binary.NativeEndian
	if len(p) < sizeofDiagMsg {
		return Socket{}, fmt.Errorf("inet_diag_msg of %d bytes, want %d", len(p), sizeofDiagMsg)
	}
	size := 16
	switch p[0] {
	case unix.AF_INET:
		size = 4
	case unix.AF_INET6:
	default:
		return Socket{}, fmt.Errorf("inet_diag_msg of family %d", p[0])
	}
	local, _ := netip.AddrFromSlice(p[8 : 8+size])
	remote, _ := netip.AddrFromSlice(p[24 : 24+size])
	s := Socket{
		Local:  netip.AddrPortFrom(local.Unmap(), binary.BigEndian.Uint16(p[4:])),
		Remote: netip.AddrPortFrom(remote.Unmap(), binary.BigEndian.Uint16(p[6:])),
		State:  p[1],
		UID:    ne.Uint32(p[64:]),
		Inode:  uint64(ne.Uint32(p[68:])),
	}
	for a := p[sizeofDiagMsg:]; len(a) > 0; {
		if len(a) < 4 {
			return Socket{}, fmt.Errorf("attribute header: %d bytes left", len(a))
		}
		size := int(ne.Uint16(a))
		if size < 4 || size > len(a) {
			return Socket{}, fmt.Errorf("attribute of %d bytes in %d", size, len(a))
		}
		if ne.Uint16(a[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == inetDiagInfo && size >= 4+tcpInfoBytesAcked+8 {
			s.BytesAcked = ne.Uint64(a[4+tcpInfoBytesAcked:])
		}
		a = a[min(align4(size), len(a)):]
	}
	return s, nil
}

func align4(n int) int { return (n + 3) &^ 3 }
