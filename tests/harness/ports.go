package harness

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// Ports handed to napd and engines come from below the kernel's ephemeral
// range (32768 up on Linux). A port taken by listening on port 0 and closed
// again can be handed out once more before napd binds it: to a parallel
// test's port-0 listener, to napd's own port = 0 allocation, or to an
// outgoing connection, and napd then fails with "address already in use".
// Below that range nothing is handed out by the kernel, and test binaries
// running in parallel keep out of each other's way with a lock per port,
// held until the test that took the port ends.
const (
	portLow  = 20000
	portHigh = 32767
)

// portLocks is the directory of the per-port lock files.
var portLocks = filepath.Join(os.TempDir(), "napd-test-ports")

// FreePort returns a free TCP port on 127.0.0.1 that no other test holds,
// and keeps it for t until t ends.
func FreePort(t testing.TB) int {
	t.Helper()
	if err := os.MkdirAll(portLocks, 0o755); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		port := portLow + rand.IntN(portHigh-portLow+1)
		release, ok := lockPort(port)
		if !ok {
			continue
		}
		// Not held by a test, but something else may listen there.
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			release()
			continue
		}
		l.Close()
		t.Cleanup(release)
		return port
	}
	t.Fatalf("no free port in %d-%d", portLow, portHigh)
	return 0
}

// lockPort takes the lock of port without waiting. release removes the lock
// file and drops the lock, so the directory keeps only ports in use.
func lockPort(port int) (release func(), ok bool) {
	path := filepath.Join(portLocks, strconv.Itoa(port))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil, false
	}
	// The holder before us may have removed the file between our open and
	// our lock: then we hold a lock on nothing.
	held, err1 := f.Stat()
	named, err2 := os.Stat(path)
	if err1 != nil || err2 != nil || !os.SameFile(held, named) {
		f.Close()
		return nil, false
	}
	return func() {
		os.Remove(path)
		f.Close()
	}, true
}
