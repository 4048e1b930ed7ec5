//go:build linux

package systemd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
)

// Probe says whether the systemd backend can work here, for supervisor =
// "auto": PID 1 is systemd (/run/systemd/system exists and /proc/1/comm is
// "systemd") and systemd answers on the system bus. why is a human reason
// either way, for the log line that says which backend was picked.
func Probe(ctx context.Context) (ok bool, why string) {
	return probe(ctx, "/", func(ctx context.Context) (string, error) {
		conn, err := sdbus.NewSystemConnectionContext(ctx)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		p, err := conn.SystemStateContext(ctx)
		if err != nil {
			return "", err
		}
		return strings.Trim(p.Value.String(), `"`), nil
	})
}

// probe checks the files under root, then asks the bus for the system state.
func probe(ctx context.Context, root string, systemState func(context.Context) (string, error)) (bool, string) {
	if fi, err := os.Stat(filepath.Join(root, "run/systemd/system")); err != nil || !fi.IsDir() {
		return false, "not booted with systemd (no /run/systemd/system)"
	}
	comm, err := os.ReadFile(filepath.Join(root, "proc/1/comm"))
	if err != nil {
		return false, fmt.Sprintf("cannot tell PID 1: %v", err)
	}
	if c := strings.TrimSpace(string(comm)); c != "systemd" {
		return false, fmt.Sprintf("PID 1 is %q, not systemd", c)
	}
	state, err := systemState(ctx)
	if err != nil {
		return false, fmt.Sprintf("systemd does not answer on the system bus: %v", err)
	}
	return true, fmt.Sprintf("PID 1 is systemd and answers on the system bus (system state %s)", state)
}
