// Package ipcsock prepares ipc:// addresses for binding.
//
// It removes only a socket file no process listens on any more; it must not
// remove one a live process is bound to.
package ipcsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
)

// RemoveStale removes the socket file of an ipc:// address that no process
// listens on any more (left by a process that was killed), so a restarted
// one can bind. A live listener is an error; other addresses are left alone.
func RemoveStale(address string) error {
	path, ok := strings.CutPrefix(address, "ipc://")
	if !ok {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("another process listens on %s", path)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return os.Remove(path)
	}
	return nil
}
