//go:build linux

package sockets

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nlMsg is a netlink message: header and payload, padded to 4 bytes.
func nlMsg(typ, flags uint16, seq uint32, payload []byte) []byte {
	ne := binary.NativeEndian
	b := make([]byte, align4(unix.NLMSG_HDRLEN+len(payload)))
	ne.PutUint32(b[0:], uint32(unix.NLMSG_HDRLEN+len(payload)))
	ne.PutUint16(b[4:], typ)
	ne.PutUint16(b[6:], flags)
	ne.PutUint32(b[8:], seq)
	copy(b[unix.NLMSG_HDRLEN:], payload)
	return b
}

// diagMsg is the kernel's answer for one socket: a struct inet_diag_msg,
// an INET_DIAG_INFO attribute holding a tcp_info of tcpInfoLen bytes (none
// when 0) and another attribute around it.
func diagMsg(s Socket, v6 bool, tcpInfoLen int) []byte {
	ne := binary.NativeEndian
	p := make([]byte, sizeofDiagMsg)
	p[0], p[1] = unix.AF_INET, s.State
	if v6 {
		p[0] = unix.AF_INET6
	}
	binary.BigEndian.PutUint16(p[4:], s.Local.Port())
	binary.BigEndian.PutUint16(p[6:], s.Remote.Port())
	addr := func(a netip.Addr) []byte {
		if v6 {
			b := a.As16()
			return b[:]
		}
		b := a.As4()
		return b[:]
	}
	copy(p[8:], addr(s.Local.Addr()))
	copy(p[24:], addr(s.Remote.Addr()))
	ne.PutUint32(p[64:], s.UID)
	ne.PutUint32(p[68:], uint32(s.Inode))
	attr := func(typ uint16, data []byte) []byte {
		a := make([]byte, align4(4+len(data)))
		ne.PutUint16(a, uint16(4+len(data)))
		ne.PutUint16(a[2:], typ)
		copy(a[4:], data)
		return a
	}
	p = append(p, attr(1, []byte{1, 2, 3})...) // INET_DIAG_MEMINFO, say: skipped
	if tcpInfoLen > 0 {
		info := make([]byte, tcpInfoLen)
		if tcpInfoLen >= tcpInfoBytesAcked+8 {
			ne.PutUint64(info[tcpInfoBytesAcked:], s.BytesAcked)
		}
		p = append(p, attr(inetDiagInfo, info)...)
	}
	return p
}

func TestTCPInfoLayout(t *testing.T) {
	if off := unsafe.Offsetof(unix.TCPInfo{}.Bytes_acked); off != tcpInfoBytesAcked {
		t.Errorf("tcpi_bytes_acked at %d, want %d", off, tcpInfoBytesAcked)
	}
}

func TestParseDiag(t *testing.T) {
	v4 := Socket{Local: ap("127.0.0.1:8001"), Remote: ap("127.0.0.1:40000"), State: StateEstablished, UID: 1000, Inode: 77487, BytesAcked: 1 << 40}
	v6 := Socket{Local: ap("[::1]:8002"), Remote: ap("[2001:db8::7]:41000"), State: StateCloseWait, UID: 0, Inode: 5, BytesAcked: 12}
	mapped := Socket{Local: ap("127.0.0.1:8003"), Remote: ap("127.0.0.1:42000"), State: StateEstablished, Inode: 6}
	// A kernel before 4.1 has a shorter tcp_info, without bytes_acked.
	old := Socket{Local: ap("0.0.0.0:8004"), Remote: ap("0.0.0.0:0"), State: StateListen, Inode: 7}

	dump := slices.Concat(
		nlMsg(sockDiagByFamily, unix.NLM_F_MULTI, 3, diagMsg(v4, false, 232)),
		nlMsg(sockDiagByFamily, unix.NLM_F_MULTI, 3, diagMsg(v6, true, 232)),
		// An IPv4 client of a dual-stack listener: v4-mapped, unmapped.
		nlMsg(sockDiagByFamily, unix.NLM_F_MULTI, 3, diagMsg(mapped, true, 232)),
		nlMsg(sockDiagByFamily, unix.NLM_F_MULTI, 3, diagMsg(old, false, 104)),
	)
	socks, d, err := parseDiag(dump, 3, nil)
	if err != nil || d.done || d.interrupted {
		t.Fatalf("parseDiag = %v, %+v; want 4 sockets, more to come", err, d)
	}
	if want := []Socket{v4, v6, mapped, old}; !slices.Equal(socks, want) {
		t.Errorf("sockets\n%+v, want\n%+v", socks, want)
	}

	done := nlMsg(unix.NLMSG_DONE, unix.NLM_F_MULTI|unix.NLM_F_DUMP_INTR, 3, []byte{0, 0, 0, 0})
	socks, d, err = parseDiag(done, 3, socks)
	if err != nil || !d.done || !d.interrupted || len(socks) != 4 {
		t.Errorf("NLMSG_DONE, interrupted: %v, %+v, %d sockets", err, d, len(socks))
	}

	errno := func(e syscall.Errno) []byte {
		b := make([]byte, unix.SizeofNlMsgerr)
		binary.NativeEndian.PutUint32(b, uint32(-int32(e)))
		return b
	}
	for name, tt := range map[string]struct {
		b    []byte
		want error
	}{
		"kernel error":        {nlMsg(unix.NLMSG_ERROR, 0, 3, errno(unix.EPERM)), unix.EPERM},
		"dump failed midway":  {nlMsg(unix.NLMSG_DONE, unix.NLM_F_MULTI, 3, errno(unix.ENOBUFS)), unix.ENOBUFS},
		"other sequence":      {nlMsg(sockDiagByFamily, 0, 2, diagMsg(v4, false, 232)), nil},
		"short header":        {nlMsg(unix.NLMSG_DONE, 0, 3, nil)[:8], nil},
		"length past the end": {nlMsg(sockDiagByFamily, 0, 3, diagMsg(v4, false, 232))[:100], nil},
		"short inet_diag_msg": {nlMsg(sockDiagByFamily, 0, 3, diagMsg(v4, false, 0)[:40]), nil},
		"unknown family":      {nlMsg(sockDiagByFamily, 0, 3, append([]byte{99}, diagMsg(v4, false, 0)[1:]...)), nil},
		"attribute too long":  {nlMsg(sockDiagByFamily, 0, 3, append(diagMsg(v4, false, 0), 200, 0, 2, 0)), nil},
		"unknown message":     {nlMsg(unix.NLMSG_NOOP, 0, 3, nil), nil},
	} {
		_, _, err := parseDiag(tt.b, 3, nil)
		if err == nil || tt.want != nil && !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want an error (%v)", name, err, tt.want)
		}
	}
}

func TestDiagRequest(t *testing.T) {
	b := diagRequest(unix.AF_INET6, wanted, 9)
	ne := binary.NativeEndian
	if len(b) != 72 || ne.Uint32(b) != 72 || ne.Uint16(b[4:]) != sockDiagByFamily ||
		ne.Uint16(b[6:]) != unix.NLM_F_REQUEST|unix.NLM_F_DUMP || ne.Uint32(b[8:]) != 9 {
		t.Errorf("header % x", b[:16])
	}
	r := b[16:]
	if r[0] != unix.AF_INET6 || r[1] != unix.IPPROTO_TCP || r[2] != 1<<(inetDiagInfo-1) || ne.Uint32(r[4:]) != 1<<1|1<<8|1<<10 {
		t.Errorf("inet_diag_req_v2 % x: want AF_INET6, TCP, INET_DIAG_INFO, ESTABLISHED|CLOSE_WAIT|LISTEN", r[:8])
	}
}

func FuzzParseDiag(f *testing.F) {
	s := Socket{Local: ap("127.0.0.1:8001"), Remote: ap("127.0.0.1:40000"), State: StateEstablished, Inode: 9, BytesAcked: 77}
	f.Add(slices.Concat(nlMsg(sockDiagByFamily, unix.NLM_F_MULTI, 1, diagMsg(s, false, 232)),
		nlMsg(sockDiagByFamily, unix.NLM_F_MULTI, 1, diagMsg(s, true, 104)),
		nlMsg(unix.NLMSG_DONE, unix.NLM_F_MULTI, 1, []byte{0, 0, 0, 0})), uint32(1))
	f.Add(nlMsg(unix.NLMSG_ERROR, 0, 1, []byte{0xff, 0xff, 0xff, 0xff}), uint32(1))
	f.Fuzz(func(t *testing.T, data []byte, seq uint32) {
		socks, _, err := parseDiag(data, seq, nil)
		if err != nil {
			return
		}
		if len(socks) > len(data)/(unix.NLMSG_HDRLEN+sizeofDiagMsg) {
			t.Fatalf("%d sockets from %d bytes", len(socks), len(data))
		}
		for _, s := range socks {
			if !s.Local.IsValid() || !s.Remote.IsValid() || s.Local.Addr().Is4In6() || s.Remote.Addr().Is4In6() {
				t.Fatalf("address not valid and unmapped in %+v", s)
			}
		}
	})
}
