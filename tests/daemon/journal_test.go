package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
	"github.com/napd/napd/tests/systemd/box"
)

// boxConfig runs one demo model with the exec supervisor inside the box.
const boxConfig = `[agent]
supervisor = "exec"
state_dir = "/var/lib/napd"
control_socket = "/run/napd/control.sock"
metrics_listen = ""

[gateway]
listen = ["127.0.0.1:8080"]

[models.m]
command = ["/usr/local/bin/napd-demo-engine", "--port", "${PORT}", "--model", "m", "--startup-delay", "200ms"]
sleep = "stop"
`

// boxUnit is a minimal napd.service of Type=notify.
const boxUnit = `[Unit]
Description=napd under test

[Service]
Type=notify
ExecStart=/usr/local/bin/napd --config /etc/napd/napd.toml
ExecReload=/bin/kill -HUP $MAINPID
WatchdogSec=10s
`

// napd under a real systemd and journald: `systemctl start` returns once
// READY=1 arrived, StatusText follows the models, a reload goes through
// RELOADING=1/READY=1, and records are journal entries with fields, so
// `journalctl -u napd MODEL=m` and `STATE=awake` select them.
func TestJournal_UnderSystemd(t *testing.T) {
	b := box.Boot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(argv ...string) string {
		t.Helper()
		out, stderr, err := b.Run(ctx, argv...)
		if err != nil {
			t.Fatalf("%v\n%s%s", err, out, stderr)
		}
		return out
	}
	bin := harness.Bin(t)
	for _, p := range []string{"napd", "napctl", "napd-demo-engine"} {
		if err := b.CopyIn(filepath.Join(bin, p), "/usr/local/bin/"+p); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(t.TempDir(), "napd.toml")
	writeFile(t, cfg, boxConfig)
	if err := b.CopyIn(cfg, "/etc/napd/napd.toml"); err != nil {
		t.Fatal(err)
	}
	if err := b.InstallUnit(ctx, "napd.service", boxUnit); err != nil {
		t.Fatal(err)
	}
	run("ip", "link", "set", "lo", "up")
	run("systemctl", "start", "napd.service") // Type=notify: returns after READY=1
	statusText := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := strings.TrimSpace(run("systemctl", "show", "napd.service", "-p", "StatusText", "--value"))
			if strings.Contains(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("StatusText %q, want %q", got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	statusText("1 model: 0 awake, 1 asleep; 0 requests in flight")
	if out := run("napctl", "wake", "m"); !strings.Contains(out, "m: awake after") {
		t.Fatalf("napctl wake in the box: %q", out)
	}
	statusText("1 model: 1 awake, 0 asleep")

	run("systemctl", "reload", "napd.service") // waits for READY=1 after RELOADING=1
	if st := strings.TrimSpace(run("systemctl", "is-active", "napd.service")); st != "active" {
		t.Errorf("napd after reload: %s", st)
	}

	journal := func(match ...string) string {
		t.Helper()
		return run(append([]string{"journalctl", "--no-pager", "-u", "napd.service", "-o", "cat"}, match...)...)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(journal(), "config reloaded") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if out := journal("MODEL=m"); !strings.Contains(out, "state changed") || strings.Contains(out, "napd ready") {
		t.Errorf("journalctl -u napd MODEL=m:\n%s", out)
	}
	if out := journal("MODEL=m", "STATE=awake"); !strings.Contains(out, "state changed") {
		t.Errorf("journalctl -u napd MODEL=m STATE=awake:\n%s", out)
	}
	if out := run("journalctl", "--no-pager", "-u", "napd.service", "MODEL=m", "-o", "verbose"); !strings.Contains(out, "SYSLOG_IDENTIFIER=napd") ||
		!strings.Contains(out, "REASON=") {
		t.Errorf("journal fields:\n%s", out)
	}
	run("systemctl", "stop", "napd.service")
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(journal(), "napd stopped") {
		if time.Now().After(deadline) {
			t.Fatalf("journal after stop:\n%s", journal())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
