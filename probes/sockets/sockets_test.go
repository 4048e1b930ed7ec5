//go:build linux

package sockets

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const fixtures = "../testdata/sockets/"

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// recorded is the table of fixtures tcp and tcp6, recorded with: a listener
// on 127.0.0.1:18555 and one on [::1]:18556, each with one client
// connection, and a dual-stack listener on [::]:18557 with a client
// connected to 127.0.0.1:18557.
func recorded(t testing.TB) []Socket {
	t.Helper()
	v4, err := ParseProcNet(fixture(t, "tcp"), false)
	if err != nil {
		t.Fatal(err)
	}
	v6, err := ParseProcNet(fixture(t, "tcp6"), true)
	if err != nil {
		t.Fatal(err)
	}
	return append(v4, v6...)
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestParseProcNet_Recorded(t *testing.T) {
	socks := recorded(t)
	if len(socks) != 12 {
		t.Fatalf("got %d sockets, want 12", len(socks))
	}
	want := []Socket{
		{Local: ap("127.0.0.1:18555"), Remote: ap("0.0.0.0:0"), State: StateListen, Inode: 77482},
		{Local: ap("127.0.0.1:36040"), Remote: ap("127.0.0.1:18557"), State: StateTimeWait},
		{Local: ap("127.0.0.1:18555"), Remote: ap("127.0.0.1:45776"), State: StateEstablished, Inode: 77487},
		{Local: ap("[::1]:18556"), Remote: ap("[::]:0"), State: StateListen, Inode: 77483},
		// An IPv4 client of a dual-stack listener: the v4-mapped address
		// is unmapped, so it pairs with the client's end in the tcp table.
		{Local: ap("127.0.0.1:18557"), Remote: ap("127.0.0.1:58608"), State: StateEstablished, Inode: 77491},
	}
	for _, w := range want {
		found := false
		for _, s := range socks {
			if s == w {
				found = true
			}
		}
		if !found {
			t.Errorf("missing %+v in\n%+v", w, socks)
		}
	}
}

func TestParseProcNet_Malformed(t *testing.T) {
	for name, line := range map[string]string{
		"short":         "0: 0100007F:487B 00000000:0000 0A",
		"bad address":   "0: 0100007G:487B 00000000:0000 0A 0:0 0:0 0 0 0 1",
		"v4 in v6 file": "0: 0100007F:487B 00000000:0000 0A 0:0 0:0 0 0 0 1",
		"bad port":      "0: 0100007F:487 00000000:0000 0A 0:0 0:0 0 0 0 1",
		"bad inode":     "0: 0100007F:487B 00000000:0000 0A 0:0 0:0 0 0 0 x",
	} {
		v6 := name == "v4 in v6 file"
		if _, err := ParseProcNet([]byte("  sl  local_address\n"+line+"\n"), v6); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

// fakeProc builds a /proc tree: pid → its comm and socket inodes.
func fakeProc(t *testing.T, procs map[int]struct {
	comm   string
	inodes []uint64
}) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "comm"), []byte(p.comm+"\n"), 0o644)
		os.Symlink("/dev/null", filepath.Join(dir, "fd", "0"))
		for i, ino := range p.inodes {
			os.Symlink(fmt.Sprintf("socket:[%d]", ino), filepath.Join(dir, "fd", strconv.Itoa(i+3)))
		}
	}
	return root
}

type proc = struct {
	comm   string
	inodes []uint64
}

func TestTable_OutsideAndListeners_Recorded(t *testing.T) {
	root := fakeProc(t, map[int]proc{
		100:  {"napd", []uint64{77486}},                  // napd is the client of 18555
		4711: {"curl", []uint64{77490}},                  // curl is the client of 18557
		999:  {"python3", []uint64{77482, 77485, 77487}}, // the listeners
	})
	tab := &Table{r: Reader{Proc: root, Self: 100}, Sockets: recorded(t), owners: map[uint64]Process{}}

	peers, err := tab.Outside(18555)
	if err != nil || len(peers) != 0 {
		t.Errorf("Outside(18555) = %v, %v; want none: its client is napd", peers, err)
	}
	peers, err = tab.Outside(18557)
	if err != nil || len(peers) != 1 {
		t.Fatalf("Outside(18557) = %v, %v; want curl", peers, err)
	}
	if got, want := peers[0].String(), "127.0.0.1:58608 (pid 4711, curl)"; got != want {
		t.Errorf("peer = %q, want %q", got, want)
	}
	if peers, _ := tab.Outside(18556); len(peers) != 1 || peers[0].PID != 0 {
		t.Errorf("Outside(18556) = %v; want one client whose process is unknown", peers)
	}

	ls := tab.Listeners(18555, nil)
	if len(ls) != 1 || ls[0].PID != 999 || ls[0].Name != "python3" {
		t.Errorf("Listeners(18555) = %+v, want pid 999 (python3)", ls)
	}
	if !tab.Listening(18555) || tab.Listening(18556) || tab.Listening(18554) {
		t.Error("Listening: want 18555 only ([::1] does not receive 127.0.0.1)")
	}
	if ls := tab.Listeners(18556, nil); len(ls) != 0 {
		t.Errorf("Listeners(18556) = %+v: [::1] does not receive 127.0.0.1", ls)
	}
	if ls := tab.Listeners(18557, []int{999}); len(ls) != 1 || ls[0].Addr != ap("[::]:18557") || ls[0].PID != 999 {
		t.Errorf("Listeners(18557) = %+v, want the dual-stack listener of pid 999", ls)
	}
}

func TestParseSocketLink(t *testing.T) {
	for link, want := range map[string]uint64{"socket:[77482]": 77482, "pipe:[3]": 0, "socket:[x]": 0, "socket:[12": 0} {
		got, ok := ParseSocketLink(link)
		if got != want || ok != (want != 0) {
			t.Errorf("%q: got %d, %v", link, got, ok)
		}
	}
}

// TestMain lets the test binary act as another process: a client holding
// a connection, or a listener.
func TestMain(m *testing.M) {
	switch os.Getenv("SOCKETS_TEST_HELPER") {
	case "connect":
		c, err := net.Dial("tcp", os.Getenv("SOCKETS_TEST_ADDR"))
		if err != nil {
			os.Exit(1)
		}
		fmt.Printf("%s\n", c.LocalAddr())
		os.Stdin.Read(make([]byte, 1)) // until the test closes stdin
		os.Exit(0)
	case "listen":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Printf("%s\n", l.Addr())
		os.Stdin.Read(make([]byte, 1))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper starts the test binary as a helper process and returns its pid
// and the address it printed; it ends with the test.
func helper(t *testing.T, mode, addr string) (int, netip.AddrPort) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOCKETS_TEST_HELPER="+mode, "SOCKETS_TEST_ADDR="+addr)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper %s: %v", mode, err)
	}
	a, err := netip.ParseAddrPort(line[:len(line)-1])
	if err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid, a
}

func TestReader_Live(t *testing.T) {
	for _, r := range []Reader{{}, {NoNetlink: true}} {
		name := "netlink"
		if r.NoNetlink {
			name = "proc"
		}
		t.Run(name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			port := l.Addr().(*net.TCPAddr).Port
			own, err := net.Dial("tcp", l.Addr().String()) // napd's own client
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			pid, client := helper(t, "connect", l.Addr().String())

			// The helper printed its address once connected: both ends
			// are in the table (the engine's end maybe not yet accepted).
			tab, err := r.Read()
			if err != nil {
				t.Fatal(err)
			}
			peers, err := tab.Outside(port)
			if err != nil {
				t.Fatal(err)
			}
			if ls := tab.Listeners(port, nil); len(ls) != 1 || ls[0].PID != os.Getpid() {
				t.Errorf("listeners %+v, want this process %d", ls, os.Getpid())
			}
			if len(peers) != 1 || peers[0].Addr != client || peers[0].PID != pid {
				t.Fatalf("outside peers %v, want only %s of pid %d", peers, client, pid)
			}
		})
	}
}

// The table holds the listener and both ends of an established
// connection, but none of the TIME_WAIT sockets of connections a client
// closed first: the kernel filters them out of the netlink dump, Read out
// of /proc/net/tcp.
func TestReader_LiveNoTimeWait(t *testing.T) {
	port, client, server := connected(t)
	clientEnd := client.LocalAddr().(*net.TCPAddr).AddrPort()
	serverEnd := server.LocalAddr().(*net.TCPAddr).AddrPort()

	closed := closeFirst(t, 5)
	// The client ends reach TIME_WAIT once the server's FIN is
	// acknowledged: wait until /proc/net/tcp, unfiltered, shows them all.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n := 0
		for _, s := range tcp4(t) {
			if s.State == StateTimeWait && slices.ContainsFunc(closed, func(e closedEnd) bool { return e.is(s) }) {
				n++
			}
		}
		if n == len(closed) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d closed client ends in TIME_WAIT", n, len(closed))
		}
	}

	for _, r := range []Reader{{}, {NoNetlink: true}} {
		tab, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		t.Run(strings.TrimPrefix(tab.Source, "/proc/net/"), func(t *testing.T) {
			has := func(local netip.AddrPort, state uint8) bool {
				return slices.ContainsFunc(tab.Sockets, func(s Socket) bool { return s.Local == local && s.State == state })
			}
			for _, s := range tab.Sockets {
				if !isWanted(s.State) {
					t.Errorf("socket in state %#x in the table: %+v", s.State, s)
				}
				if slices.ContainsFunc(closed, func(e closedEnd) bool { return e.is(s) }) {
					t.Errorf("a closed connection's end in the table: %+v", s)
				}
			}
			if !has(clientEnd, StateEstablished) || !has(serverEnd, StateEstablished) {
				t.Errorf("the established connection %s-%s is missing", clientEnd, serverEnd)
			}
			if !tab.Listening(port) {
				t.Error("the listener is missing")
			}
		})
	}
}

// closedEnd is the client end of a connection closed first: its address
// and its peer's (on a busy machine another connection may reuse the port).
type closedEnd struct{ local, remote netip.AddrPort }

func (e closedEnd) is(s Socket) bool { return s.Local == e.local && s.Remote == e.remote }

// tcp4 is /proc/net/tcp, every state.
func tcp4(t testing.TB) []Socket {
	t.Helper()
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	socks, err := ParseProcNet(data, false)
	if err != nil {
		t.Fatal(err)
	}
	return socks
}

func TestReader_LiveForeignListener(t *testing.T) {
	pid, addr := helper(t, "listen", "")
	tab, err := Reader{}.Read()
	if err != nil {
		t.Fatal(err)
	}
	ls := tab.Listeners(int(addr.Port()), []int{os.Getpid()})
	if len(ls) != 1 || ls[0].PID != pid || ls[0].Name == "" {
		t.Fatalf("listeners %+v, want the helper %d", ls, pid)
	}
}

func FuzzParseProcNet(f *testing.F) {
	f.Add(fixture(f, "tcp"), false)
	f.Add(fixture(f, "tcp6"), true)
	f.Fuzz(func(t *testing.T, data []byte, v6 bool) {
		socks, err := ParseProcNet(data, v6)
		if err != nil {
			return
		}
		for _, s := range socks {
			if !s.Local.IsValid() || !s.Remote.IsValid() {
				t.Fatalf("invalid address in %+v", s)
			}
			if !v6 && (!s.Local.Addr().Is4() || !s.Remote.Addr().Is4()) {
				t.Fatalf("IPv6 address from /proc/net/tcp: %+v", s)
			}
		}
	})
}

func TestMoved(t *testing.T) {
	a := Conn{ap("127.0.0.1:8001"), ap("127.0.0.1:40000")}
	b := Conn{ap("127.0.0.1:8001"), ap("127.0.0.1:40001")}
	for _, tt := range []struct {
		name          string
		before, after map[Conn]uint64
		want          bool
	}{
		{"no connections", nil, nil, false},
		{"a stream that grows", map[Conn]uint64{a: 100}, map[Conn]uint64{a: 250}, true},
		{"a stalled stream", map[Conn]uint64{a: 100}, map[Conn]uint64{a: 100}, false},
		{"a closed connection", map[Conn]uint64{a: 100, b: 5}, map[Conn]uint64{a: 100}, false},
		{"a new connection answered", map[Conn]uint64{a: 100}, map[Conn]uint64{a: 100, b: 20}, true},
		{"a new connection not answered", map[Conn]uint64{a: 100}, map[Conn]uint64{a: 100, b: 0}, false},
	} {
		if got := Moved(tt.before, tt.after); got != tt.want {
			t.Errorf("%s: Moved = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The engine's end of a connection counts what it sent, not what it
// received: a stopped engine that reads nothing and writes nothing shows
// no progress while its clients send.
func TestTable_SentLive(t *testing.T) {
	port, client, server := connected(t)
	before := netlinkTable(t).Sent(port)
	if len(before) != 1 {
		t.Fatalf("Sent = %v, want one connection", before)
	}
	client.Write([]byte("GET /health HTTP/1.1\r\n\r\n")) // the engine does not read
	if Moved(before, netlinkTable(t).Sent(port)) {
		t.Error("bytes the client sent count as the engine's progress")
	}
	answerMoves(t, port, server, client, "data: tok\n\n", before)
	if (&Table{Source: "/proc/net/tcp"}).Sent(port) != nil {
		t.Error("/proc has no byte counts: Sent must be nil")
	}
}

// A client that half-closes after its request leaves the engine's end in
// CLOSE_WAIT while the engine writes the answer: Sent counts that as
// progress, Outside does not count the connection as a client.
func TestTable_SentHalfClosedLive(t *testing.T) {
	port, client, server := connected(t)
	client.Write([]byte("GET /v1/models HTTP/1.0\r\n\r\n"))
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, server); err != nil { // to the client's FIN: CLOSE_WAIT
		t.Fatal(err)
	}
	tab := netlinkTable(t)
	before := tab.Sent(port)
	if len(before) != 1 {
		t.Fatalf("Sent = %v, want the half-closed connection", before)
	}
	if peers, err := tab.Outside(port); err != nil || len(peers) != 0 {
		t.Errorf("Outside = %v, %v; want none: CLOSE_WAIT is no client in use", peers, err)
	}
	answerMoves(t, port, server, client, "HTTP/1.0 200 OK\r\n\r\n", before)
}

// connected opens a loopback listener and one connection to it, accepted;
// all three close with the test.
func connected(t *testing.T) (port int, client *net.TCPConn, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if client, err = net.DialTCP("tcp", nil, l.Addr().(*net.TCPAddr)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if server, err = l.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return l.Addr().(*net.TCPAddr).Port, client, server
}

// netlinkTable reads the table, skipping the test where sock_diag is
// refused (Sent needs its byte counts).
func netlinkTable(t *testing.T) *Table {
	t.Helper()
	tab, err := Reader{}.Read()
	if err != nil {
		t.Fatal(err)
	}
	if tab.Source != "netlink" {
		t.Skip("no netlink sock_diag here")
	}
	return tab
}

// answerMoves has the engine's end write msg and the client read it, then
// waits until Sent(port) moved from before: the client's kernel
// acknowledges soon after (a delayed ACK at most).
func answerMoves(t *testing.T, port int, server, client net.Conn, msg string, before map[Conn]uint64) {
	t.Helper()
	if _, err := server.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); !Moved(before, netlinkTable(t).Sent(port)); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the engine wrote, but Sent stays %v", before)
		}
	}
}

// closeFirst makes n loopback connections whose client end closes first,
// so each client socket goes to TIME_WAIT for 60 s, and returns the
// client ends. The server end reads to EOF, then closes.
func closeFirst(t testing.TB, n int) []closedEnd {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		for range n {
			c, err := l.Accept()
			if err != nil {
				served <- err
				return
			}
			io.Copy(io.Discard, c)
			c.Close()
		}
		served <- nil
	}()
	out := make([]closedEnd, 0, n)
	for range n {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, closedEnd{c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()})
		c.Close()
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	return out
}

// timeWaits counts the IPv4 sockets in TIME_WAIT.
func timeWaits(t testing.TB) int {
	n := 0
	for _, s := range tcp4(t) {
		if s.State == StateTimeWait {
			n++
		}
	}
	return n
}

// BenchmarkReader_Read reads a table beside 20,000 TIME_WAIT sockets (a
// busy gateway host's: each closed client connection leaves one for 60 s).
// Run it in a network namespace of its own (unshare -n, lo up) so other
// processes' sockets do not count: at most 28,000 ephemeral ports.
func BenchmarkReader_Read(b *testing.B) {
	const want = 20000
	// 10,000 to each listener: connect takes even ports first, and past
	// those reuses its own TIME_WAIT ones to the same destination.
	for n := want - timeWaits(b); n > 0; n -= 10000 {
		closeFirst(b, min(n, 10000))
	}
	b.Logf("%d sockets in TIME_WAIT", timeWaits(b))
	for _, r := range []Reader{{}, {NoNetlink: true}} {
		name := "netlink"
		if r.NoNetlink {
			name = "proc"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := r.Read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
