package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// A claimed port is below the ephemeral range, free to bind, held against
// every other claim until its test ends, and leaves no lock file behind.
func TestFreePort_HeldUntilTheTestEnds(t *testing.T) {
	var port int
	t.Run("claim", func(t *testing.T) {
		port = FreePort(t)
		if port < portLow || port > portHigh {
			t.Fatalf("port %d outside %d-%d", port, portLow, portHigh)
		}
		if other := FreePort(t); other == port {
			t.Fatalf("port %d handed out twice", port)
		}
		if _, ok := lockPort(port); ok {
			t.Fatalf("port %d locked again while its test holds it", port)
		}
	})
	if _, err := os.Stat(filepath.Join(portLocks, strconv.Itoa(port))); !os.IsNotExist(err) {
		t.Errorf("lock file of port %d after its test ended: %v", port, err)
	}
	release, ok := lockPort(port)
	if !ok {
		t.Fatalf("port %d not free after its test ended", port)
	}
	release()
}
