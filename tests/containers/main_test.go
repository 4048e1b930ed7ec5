// Package containers runs napd with engines in containers, with the real
// runtimes: rootful podman, and docker with a daemon of the tests' own,
// under the exec supervisor on the host and under the systemd supervisor
// in a systemd box (tests/systemd/box). The image is built here: a root
// file system holding the statically built napd-demo-engine, imported
// (no registry is reachable from the test machines).
//
// What the machines need, found on them (docs/containers.md has what a
// host needs): podman with runc and ulimits under the sandbox's hard
// limits; inside the box also storage outside its overlay root, and a
// network namespace of its own before the runtimes may make a bridge
// (container_port); docker a daemon the tests start, without a bridge on
// the host.
package containers

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
	"github.com/napd/napd/tests/systemd/box"
)

const (
	inBoxEnv    = "NAPD_IN_BOX"
	testdataEnv = "NAPD_TEST_TESTDATA" // where testdata/ is, inside the box
)

func TestMain(m *testing.M) {
	code := harness.Main(m)
	teardown()
	os.Exit(code)
}

func onHost(t *testing.T) {
	t.Helper()
	if os.Getenv(inBoxEnv) == "1" {
		t.Skip("runs on the host")
	}
}

func TestExec_Podman(t *testing.T) {
	onHost(t)
	scenario(t, setup{rt: Podman(t), supervisor: "exec"})
}

func TestExec_Docker(t *testing.T) {
	onHost(t)
	scenario(t, setup{rt: Docker(t, false), supervisor: "exec"})
}

// TestSystemd boots a box and runs the TestInBox_* tests inside it, with
// this binary, napd's and the image built here.
func TestSystemd(t *testing.T) {
	onHost(t)
	b := box.Boot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.Bin(t)
	copies := map[string]string{
		exe:                                     box.SharedPath + "/bin/containers.test",
		image(t):                                box.SharedPath + "/img.tar",
		filepath.Join("testdata", "nvidia-smi"): box.SharedPath + "/testdata/nvidia-smi",
	}
	for _, p := range []string{"napd", "napctl", "napd-demo-engine"} {
		copies[filepath.Join(bin, p)] = box.SharedPath + "/bin/" + p
	}
	for from, to := range copies {
		if err := b.CopyIn(from, to); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"env", inBoxEnv + "=1", harness.BinEnv + "=" + box.SharedPath + "/bin", ImageEnv + "=" + box.SharedPath + "/img.tar",
		testdataEnv + "=" + box.SharedPath + "/testdata", box.SharedPath + "/bin/containers.test", "-test.run", "^TestInBox_", "-test.count=1", "-test.v"}
	out, err := b.Command(ctx, args...).CombinedOutput()
	t.Logf("in the box:\n%s", out)
	if err != nil {
		t.Fatalf("in-box tests failed: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestInBox_Podman") {
		t.Fatal("the in-box podman test did not pass")
	}
}

func inBox(t *testing.T) {
	t.Helper()
	if os.Getenv(inBoxEnv) != "1" {
		t.Skip("runs inside the systemd box (TestSystemd)")
	}
}

func TestInBox_Podman(t *testing.T) {
	inBox(t)
	rt := Podman(t)
	scenario(t, setup{rt: rt, supervisor: "systemd", published: true, unitCheck: func(t *testing.T, model string) {
		// --cgroups=split: conmon and the engine sit in the unit's cgroup.
		unitShows(t, model, "/napd-demo-engine --port", "conmon")
	}})
}

func TestInBox_Docker(t *testing.T) {
	inBox(t)
	rt := Docker(t, true)
	scenario(t, setup{rt: rt, supervisor: "systemd", published: true, unitCheck: func(t *testing.T, model string) {
		// The container is the daemon's; the unit runs its attached client.
		unitShows(t, model, "docker start --attach")
	}})
}

// unitShows checks the model's engine unit as an operator sees it:
// systemctl status lists want, journalctl -u holds the engine's output.
func unitShows(t *testing.T, model string, want ...string) {
	t.Helper()
	unit := "napd-engine-" + model + ".service"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status, _ := execIn(ctx, "systemctl", "status", "--no-pager", "--lines=0", unit)
	for _, w := range want {
		if !strings.Contains(status, w) {
			t.Errorf("systemctl status %s lacks %q:\n%s", unit, w, status)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		journal, _ := execIn(ctx, "journalctl", "--no-pager", "--output=cat", "-u", unit)
		if strings.Contains(journal, "msg=listening") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("journalctl -u %s has no engine output:\n%s", unit, journal)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// execIn runs a command of the box (the test runs inside it) and returns
// its output.
func execIn(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}
