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
	"fmt"
	"io"
	"net/http"
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
	t.Parallel()
	scenario(t, setup{rt: Podman(t), supervisor: "exec"})
}

func TestExec_Docker(t *testing.T) {
	onHost(t)
	t.Parallel()
	scenario(t, setup{rt: Docker(t, false), supervisor: "exec"})
}

// TestSystemd_Podman and TestSystemd_Docker each boot a box and run
// TestInBox_* tests inside it, with this binary, napd's and the image
// built here. One box each, and the tests in a box one after the other:
// a napd under systemd stops every napd-engine-* unit its config does not
// name when it starts, so two napds must not share a systemd.
func TestSystemd_Podman(t *testing.T) {
	onHost(t)
	t.Parallel()
	runInBox(t, "^TestInBox_(Podman|UnderNapdService)$", "TestInBox_Podman", "TestInBox_UnderNapdService")
}

func TestSystemd_Docker(t *testing.T) {
	onHost(t)
	t.Parallel()
	runInBox(t, "^TestInBox_Docker$", "TestInBox_Docker")
}

func runInBox(t *testing.T, run string, pass ...string) {
	b := box.Boot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.Bin(t)
	copies := [][2]string{
		{exe, box.SharedPath + "/bin/containers.test"},
		{image(t), box.SharedPath + "/img.tar"},
		{filepath.Join("testdata", "nvidia-smi"), box.SharedPath + "/testdata/nvidia-smi"},
		{filepath.Join(bin, "napd"), "/usr/bin/napd"},
		{filepath.Join(bin, "napctl"), "/usr/bin/napctl"},
	}
	for _, p := range []string{"napd", "napctl", "napd-demo-engine"} {
		copies = append(copies, [2]string{filepath.Join(bin, p), box.SharedPath + "/bin/" + p})
	}
	for from, to := range serviceFiles {
		copies = append(copies, [2]string{filepath.Join(harness.RepoRoot(), from), to})
	}
	for _, c := range copies {
		if err := b.CopyIn(c[0], c[1]); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"env", inBoxEnv + "=1", harness.BinEnv + "=" + box.SharedPath + "/bin", ImageEnv + "=" + box.SharedPath + "/img.tar",
		testdataEnv + "=" + box.SharedPath + "/testdata", box.SharedPath + "/bin/containers.test", "-test.run", run, "-test.count=1", "-test.v"}
	out, err := b.Command(ctx, args...).CombinedOutput()
	t.Logf("in the box:\n%s", out)
	if err != nil {
		t.Fatalf("in-box tests failed: %v", err)
	}
	for _, want := range pass {
		if !strings.Contains(string(out), "--- PASS: "+want) {
			t.Fatalf("%s did not pass in the box", want)
		}
	}
}

func inBox(t *testing.T) {
	t.Helper()
	if os.Getenv(inBoxEnv) != "1" {
		t.Skip("runs inside a systemd box (TestSystemd_*)")
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

// What runInBox copies into the box for TestInBox_UnderNapdService:
// the package's units and users, and napd where the unit runs it.
var serviceFiles = map[string]string{
	"packaging/systemd/napd.service": box.UnitDir + "/napd.service",
	"packaging/systemd/napd.socket":  box.UnitDir + "/napd.socket",
	"packaging/sysusers.conf":        box.SharedPath + "/sysusers.conf",
}

// TestInBox_UnderNapdService: napd as the package runs it, napd.service
// with its sandbox (ProtectSystem=strict, PrivateTmp, ProtectControlGroups)
// and socket activation, runs a podman engine: the storage it writes is in
// the unit's ReadWritePaths, the container starts in its engine unit, and
// sleeping it removes the container. The storage is podman's default
// (/var/lib/containers, on a tmpfs here: overlayfs cannot stack on the box's
// overlay root); the test's only own setting is CONTAINERS_CONF (runc,
// ulimits), in a drop-in as an operator would set it.
func TestInBox_UnderNapdService(t *testing.T) {
	inBox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(argv ...string) string {
		t.Helper()
		out, err := execIn(ctx, argv[0], argv[1:]...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
		return strings.TrimSpace(out)
	}
	conf := box.SharedPath + "/service-containers.conf"
	writeFile(t, conf, "[engine]\nruntime = \"runc\"\n[containers]\ndefault_ulimits = [\"nofile=4096:4096\", \"nproc=4096:4096\"]\n")
	run("mkdir", "-p", "/var/lib/containers")
	run("mount", "-t", "tmpfs", "tmpfs", "/var/lib/containers")
	podman := func(args ...string) string {
		return run(append([]string{"env", "CONTAINERS_CONF=" + conf, "podman"}, args...)...)
	}
	t.Cleanup(func() {
		_, _ = execIn(context.Background(), "systemctl", "stop", "napd.service", "napd.socket")
		_, _ = execIn(context.Background(), "env", "CONTAINERS_CONF="+conf, "podman", "rm", "--all", "--force")
		_, _ = execIn(context.Background(), "umount", "-l", "/var/lib/containers")
	})
	podman("import", image(t), Image)
	run("systemd-sysusers", box.SharedPath+"/sysusers.conf")
	writeFile(t, "/etc/napd/napd.toml", fmt.Sprintf(`[agent]
supervisor = "systemd"
container_runtime = "podman"

[models.svc]
image = %q
command = ["%s", "--port", "${PORT}", "--model", "svc"]
sleep = "stop"
`, Image, imageEngine))
	writeFile(t, box.UnitDir+"/napd.service.d/containers.conf", "[Service]\nEnvironment=CONTAINERS_CONF="+conf+"\n")
	run("systemctl", "daemon-reload")
	run("systemctl", "start", "napd.socket")

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:8080/v1/chat/completions", strings.NewReader(harness.Chat("svc", false, 4)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		journal, _ := execIn(ctx, "journalctl", "--no-pager", "-u", "napd.service", "-n", "40")
		t.Fatalf("chat through napd.service: %s %s\n%s", resp.Status, body, journal)
	}
	if got := run("systemctl", "is-active", "napd-engine-svc.service"); got != "active" {
		t.Fatalf("napd-engine-svc.service: %s", got)
	}
	if out := run("napctl", "--socket", "/run/napd/control.sock", "sleep", "svc"); !strings.Contains(out, "asleep") {
		t.Fatalf("napctl sleep: %s", out)
	}
	if left := podman("ps", "--all", "--quiet", "--filter", "label=napd.model=svc"); left != "" {
		t.Fatalf("asleep by stop, containers left: %s", left)
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
