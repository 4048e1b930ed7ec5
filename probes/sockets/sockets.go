//go:build linux

// Package sockets reads the kernel's TCP socket table of napd's network
// namespace and names the processes behind sockets. It answers two
// questions about an engine's loopback port: which clients outside napd are
// connected to it (evidence of use napd's leases cannot see), and which
// processes listen on it (so napd never forwards to a process that is not
// the engine).
//
// The table holds only the sockets in the states napd reads (wanted): it
// comes from netlink sock_diag, which filters them in the kernel, with
// /proc/net/tcp and /proc/net/tcp6 as the fallback. A socket's owner is
// found through /proc/PID/fd, which needs the same uid or CAP_SYS_PTRACE: as
// root napd names every process; otherwise an owner may stay unknown (PID 0)
// while its uid is still known.
//
// The package keeps no state between calls and starts no goroutine.
package sockets

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// TCP states (include/net/tcp_states.h) that matter here.
const (
	StateEstablished uint8 = 0x01
	StateTimeWait    uint8 = 0x06
	StateCloseWait   uint8 = 0x08
	StateListen      uint8 = 0x0A
)

// wanted is the set of states a Table holds, as the kernel's bit mask
// (1 << state), each for a reader:
//
//   - LISTEN: who listens on an engine's port (Listening, Listeners; the
//     supervisor's port check).
//   - ESTABLISHED: a connection in use, both ends (Outside, Sent).
//   - CLOSE_WAIT: the engine's end of a connection its client half-closed
//     (shutdown after sending the request) while the engine still writes
//     the answer: Sent counts it, so such a stream is progress. Outside
//     does not: it counts presence, and most CLOSE_WAIT ends are of
//     clients already gone, napd's own closed pooled connections among
//     them (whose client end, orphaned, has no inode to tell it is napd's).
//
// Every other state is left out: SYN_SENT and SYN_RECV are handshakes
// that are ESTABLISHED by the next reading; FIN_WAIT1/2, CLOSING,
// LAST_ACK and TIME_WAIT are ends of connections that closed, and a busy
// host has tens of thousands in TIME_WAIT (60 s after each connection a
// client closed) that would cost every reading tens of milliseconds.
const wanted = 1<<StateListen | 1<<StateEstablished | 1<<StateCloseWait

func isWanted(state uint8) bool { return wanted&(1<<state) != 0 }

// Socket is one row of the TCP table.
type Socket struct {
	Local  netip.AddrPort
	Remote netip.AddrPort
	State  uint8
	UID    uint32
	// Inode identifies the socket in /proc/PID/fd ("socket:[INODE]"); 0
	// for a connection not yet accepted or one its process closed.
	Inode uint64
	// BytesAcked is what this end sent and the peer acknowledged
	// (tcpi_bytes_acked); netlink only, 0 from /proc.
	BytesAcked uint64
}

// Process names a process.
type Process struct {
	PID  int    // 0 when napd could not find it
	Name string // /proc/PID/comm
}

func (p Process) String() string {
	if p.PID == 0 {
		return "process unknown"
	}
	return fmt.Sprintf("pid %d, %s", p.PID, p.Name)
}

// Reader reads the socket table and /proc. The zero value reads the host's
// /proc through netlink first, for the calling process.
type Reader struct {
	// Proc is procfs' mount point; "" means "/proc".
	Proc string
	// Self is napd's own PID; 0 means os.Getpid(). Connections from its
	// sockets are napd's own.
	Self int
	// NoNetlink reads /proc/net/tcp{,6} only (tests, and hosts where
	// sock_diag is denied).
	NoNetlink bool
}

func (r Reader) proc() string {
	if r.Proc == "" {
		return "/proc"
	}
	return r.Proc
}

func (r Reader) self() int {
	if r.Self == 0 {
		return os.Getpid()
	}
	return r.Self
}

// Table is one reading of the TCP socket table. Its methods cache what they
// look up in /proc: use one Table from one goroutine.
type Table struct {
	r       Reader
	Sockets []Socket
	// Source says where the table came from: "netlink" or "/proc/net/tcp".
	Source  string
	owners  map[uint64]Process // inode → owner, filled as owners are looked up
	scanned bool               // every process's fds are in owners
	self    map[uint64]bool    // napd's own socket inodes, read once
}

// Read takes the table of the wanted states: netlink sock_diag for IPv4 and
// IPv6, else (or when it fails) /proc/net/tcp and /proc/net/tcp6.
func (r Reader) Read() (*Table, error) {
	t := &Table{r: r, owners: make(map[uint64]Process)}
	if !r.NoNetlink {
		if socks, err := readNetlink(); err == nil {
			t.Sockets, t.Source = socks, "netlink"
			return t, nil
		}
	}
	var errs []error
	found := false
	for _, f := range []struct {
		name string
		v6   bool
	}{{"tcp", false}, {"tcp6", true}} {
		data, err := os.ReadFile(filepath.Join(r.proc(), "net", f.name))
		if err != nil {
			// A kernel without IPv6 has no tcp6.
			errs = append(errs, err)
			continue
		}
		socks, err := ParseProcNet(data, f.v6)
		if err != nil {
			return nil, fmt.Errorf("socket table: %w", err)
		}
		found = true
		for _, s := range socks {
			if isWanted(s.State) {
				t.Sockets = append(t.Sockets, s)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("socket table: %w", errors.Join(errs...))
	}
	t.Source = "/proc/net/tcp"
	return t, nil
}

// reachesLoopback reports whether a socket bound to a receives connections
// to 127.0.0.1, where napd reaches its engines.
func reachesLoopback(a netip.Addr) bool {
	return a.IsUnspecified() || a == netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// Listener is a socket listening on a port, with its owner.
type Listener struct {
	Addr netip.AddrPort
	UID  uint32
	Process
}

// Listeners lists the sockets listening on port that receive connections
// to 127.0.0.1:port, with their owning processes. Owners are looked for
// among candidates first (the engine's processes), then everywhere.
func (t *Table) Listeners(port int, candidates []int) []Listener {
	socks := t.listening(port)
	want := map[uint64]bool{}
	for _, s := range socks {
		want[s.Inode] = s.Inode != 0
	}
	t.lookup(want, candidates)
	out := make([]Listener, len(socks))
	for i, s := range socks {
		out[i] = Listener{Addr: s.Local, UID: s.UID, Process: t.owners[s.Inode]}
	}
	return out
}

// Listening reports whether a socket listens on port and receives
// connections to 127.0.0.1:port; it looks up no owner.
func (t *Table) Listening(port int) bool { return len(t.listening(port)) > 0 }

func (t *Table) listening(port int) []Socket {
	var out []Socket
	for _, s := range t.Sockets {
		if s.State == StateListen && int(s.Local.Port()) == port && reachesLoopback(s.Local.Addr()) {
			out = append(out, s)
		}
	}
	return out
}

// Peer is a client connected to a port.
type Peer struct {
	// Addr is the client's end of the connection.
	Addr netip.AddrPort
	Process
}

func (p Peer) String() string {
	if p.PID == 0 {
		return p.Addr.String()
	}
	return fmt.Sprintf("%s (%s)", p.Addr, p.Process)
}

// Outside lists the established connections to port whose client end is
// not a socket of napd's own process: clients that bypass napd. A client on
// another host, or one whose process napd cannot see, has PID 0.
func (t *Table) Outside(port int) ([]Peer, error) {
	type conn struct{ local, remote netip.AddrPort }
	clientEnd := map[conn]uint64{} // a connection to port → the inode of its client end
	var served []Socket            // the engine's ends
	for _, s := range t.Sockets {
		if s.State != StateEstablished {
			continue
		}
		if int(s.Local.Port()) == port {
			served = append(served, s)
		}
		if int(s.Remote.Port()) == port {
			clientEnd[conn{s.Remote, s.Local}] = s.Inode
		}
	}
	if len(served) == 0 {
		return nil, nil
	}
	if t.self == nil {
		self, err := t.r.socketInodes(t.r.self())
		if err != nil {
			return nil, fmt.Errorf("napd's own sockets: %w", err)
		}
		t.self = self
	}
	self := t.self
	var out []Peer
	var inodes []uint64
	want := map[uint64]bool{}
	for _, s := range served {
		ino := clientEnd[conn{s.Local, s.Remote}]
		if ino != 0 && self[ino] {
			continue
		}
		out = append(out, Peer{Addr: s.Remote})
		inodes = append(inodes, ino)
		want[ino] = ino != 0
	}
	t.lookup(want, nil)
	for i, ino := range inodes {
		if ino != 0 {
			out[i].Process = t.owners[ino]
		}
	}
	slices.SortFunc(out, func(a, b Peer) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

// Conn names one connection: the engine's end and the client's.
type Conn struct{ Local, Remote netip.AddrPort }

// Sent is, for each connection to port whose engine end can still send
// (ESTABLISHED, or CLOSE_WAIT: the client half-closed), what the engine's
// end sent and had acknowledged: it grows only while the engine writes.
// nil when the table came from /proc, which does not say.
func (t *Table) Sent(port int) map[Conn]uint64 {
	if t.Source != "netlink" {
		return nil
	}
	out := make(map[Conn]uint64)
	for _, s := range t.Sockets {
		if (s.State == StateEstablished || s.State == StateCloseWait) && int(s.Local.Port()) == port {
			out[Conn{s.Local, s.Remote}] = s.BytesAcked
		}
	}
	return out
}

// Moved reports whether the engine wrote between two readings of Sent: a
// connection sent more than before, or a new one sent anything. A
// connection that closed is no sign either way.
func Moved(before, after map[Conn]uint64) bool {
	for c, n := range after {
		if n > before[c] {
			return true
		}
	}
	return false
}

// lookup finds the owners of the wanted inodes: first among candidates,
// then, if some are still unknown, in every process, once per Table: that
// scan records every socket's owner for later lookups.
func (t *Table) lookup(want map[uint64]bool, candidates []int) {
	missing := func() bool {
		for ino := range want {
			if _, ok := t.owners[ino]; !ok && want[ino] {
				return true
			}
		}
		return false
	}
	for _, pid := range candidates {
		if !missing() {
			return
		}
		t.own(pid, want)
	}
	if !missing() || t.scanned {
		return
	}
	t.scanned = true
	entries, err := os.ReadDir(t.r.proc())
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		t.own(pid, nil)
	}
}

// own records pid as the owner of its sockets: the wanted ones, or all
// when want is nil.
func (t *Table) own(pid int, want map[uint64]bool) {
	inodes, err := t.r.socketInodes(pid)
	if err != nil {
		return // gone, or not ours to read
	}
	for ino := range inodes {
		if want == nil || want[ino] {
			if _, ok := t.owners[ino]; !ok {
				t.owners[ino] = Process{PID: pid, Name: t.r.comm(pid)}
			}
		}
	}
}

// socketInodes lists the socket inodes among pid's open files.
func (r Reader) socketInodes(pid int) (map[uint64]bool, error) {
	dir := filepath.Join(r.proc(), strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]bool)
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := ParseSocketLink(link); ok {
			out[ino] = true
		}
	}
	return out, nil
}

// comm is pid's command name, "" when it cannot be read.
func (r Reader) comm(pid int) string {
	b, err := os.ReadFile(filepath.Join(r.proc(), strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ParseSocketLink reads the target of a /proc/PID/fd link: "socket:[INODE]".
func ParseSocketLink(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(s, 10, 64)
	return ino, err == nil
}
