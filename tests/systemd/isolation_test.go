//go:build linux

package systemd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/tests/systemd/box"
)

// isolationPort is where the isolated engine listens.
const isolationPort = 18071

// installIsolation installs, in the box, the recipe docs/security.md gives
// against local users reaching engines on loopback: napd.service in a
// private network namespace, and a prefix drop-in that puts engine units
// into it. The drop-in's prefix (napd-engine-iso-) keeps the other in-box
// tests' engines on the box's own loopback.
func installIsolation(t *testing.T, ctx context.Context, b *box.Box) {
	t.Helper()
	// A stand-in for napd: in its own network namespace, as the recipe's
	// napd.service.d/isolate.conf puts it.
	if err := b.InstallUnit(ctx, "napd.service", "[Unit]\nDescription=napd stand-in\n"+
		"[Service]\nPrivateNetwork=yes\nExecStart=/bin/sleep infinity\n"); err != nil {
		t.Fatal(err)
	}
	dropIn := filepath.Join(b.Shared(), "units", "napd-engine-iso-.service.d")
	if err := os.MkdirAll(dropIn, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := "[Unit]\nJoinsNamespaceOf=napd.service\n[Service]\nPrivateNetwork=yes\n"
	if err := os.WriteFile(filepath.Join(dropIn, "isolate.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := b.Run(ctx, "systemctl", "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v: %s", err, stderr)
	}
}

// TestInBox_EngineIsolatedInNapdsNamespace: with the recipe of
// docs/security.md, a transient engine unit napd starts joins napd's
// private network namespace. napd reaches its port; a process on the
// host's loopback (a local user) does not.
func TestInBox_EngineIsolatedInNapdsNamespace(t *testing.T) {
	ctx, be := inBox(t)
	if out, err := execOut("systemctl", "start", "napd.service"); err != nil {
		t.Fatalf("start napd.service: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = execOut("systemctl", "stop", "napd.service") })
	spec := engineSpec("iso-a", isolationPort, "serve")
	t.Cleanup(func() { be.Stop(context.Background(), spec) })
	if err := be.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, be, "iso-a", supervisor.ProcRunning)
	p := show(t, "napd-engine-iso-a.service", "DropInPaths", "PrivateNetwork")
	if !strings.Contains(p["DropInPaths"], "napd-engine-iso-.service.d/isolate.conf") || p["PrivateNetwork"] != "yes" {
		t.Fatalf("the prefix drop-in does not apply to the transient unit: %v", p)
	}
	pid, err := execOut("systemctl", "show", "napd.service", "-p", "MainPID", "--value")
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/health", isolationPort)
	probe := func(nsenter ...string) error {
		argv := append(nsenter, "env", engineEnv+"=probe", "URL="+url, boxExe)
		return exec.Command(argv[0], argv[1:]...).Run()
	}
	reached := false
	deadline := time.Now().Add(10 * time.Second)
	for !reached && time.Now().Before(deadline) { // polling: the engine listens soon after it runs
		reached = probe("nsenter", "-t", strings.TrimSpace(pid), "-n") == nil
		if !reached {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !reached {
		t.Fatal("napd's namespace does not reach the isolated engine")
	}
	if healthy(spec) {
		t.Error("the isolated engine answers on the host's loopback: a local user reaches it")
	}
}
