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
	"strconv"
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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	read := func() map[Conn]uint64 {
		tab, err := Reader{}.Read()
		if err != nil {
			t.Fatal(err)
		}
		if tab.Source != "netlink" {
			t.Skip("no netlink sock_diag here")
		}
		return tab.Sent(port)
	}
	before := read()
	if len(before) != 1 {
		t.Fatalf("Sent = %v, want one connection", before)
	}
	client.Write([]byte("GET /health HTTP/1.1\r\n\r\n")) // the engine does not read
	if Moved(before, read()) {
		t.Error("bytes the client sent count as the engine's progress")
	}
	if _, err := server.Write([]byte("data: tok\n\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 11)
	if _, err := io.ReadFull(client, buf); err != nil {
		t.Fatal(err)
	}
	// The client's kernel acknowledges soon after (a delayed ACK at most).
	for end := time.Now().Add(10 * time.Second); !Moved(before, read()); {
		if time.Now().After(end) {
			t.Fatalf("the engine wrote, but Sent stays %v", before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if (&Table{Source: "/proc/net/tcp"}).Sent(port) != nil {
		t.Error("/proc has no byte counts: Sent must be nil")
	}
}
