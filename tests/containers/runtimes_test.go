package containers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// Image is the image every test runs: a root file system holding only the
// statically built napd-demo-engine, imported into each runtime (no
// registry is reachable from the test machines).
const (
	Image       = "localhost/napd-demo:test"
	imageEngine = "/napd-demo-engine"
)

// ImageEnv names a tarball of that root file system built already (inside
// the systemd box, which has no source tree's toolchain to build it).
const ImageEnv = "NAPD_TEST_IMAGE"

// runtime is one container runtime set up for the tests: its own storage
// and settings, so that no test touches an operator's containers or another
// test binary's.
type runtime struct {
	name string   // "podman" or "docker"
	env  []string // for napd and every command of the runtime's
}

// cmd runs the runtime with the test's settings.
func (r *runtime) cmd(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, r.name, args...)
	cmd.Env = append(os.Environ(), r.env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", r.name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (r *runtime) must(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := r.cmd(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ctr is what the tests read of a container.
type ctr struct {
	ID     string `json:"Id"`
	Name   string `json:"Name"`
	State  struct{ Status string }
	Config struct{ Labels map[string]string }
}

// containers lists the containers of napd instance inst (all states).
func (r *runtime) containers(t *testing.T, inst string) []ctr {
	t.Helper()
	ids := strings.Fields(r.must(t, "ps", "--all", "--quiet", "--no-trunc", "--filter", "label=napd.instance="+inst))
	if len(ids) == 0 {
		return nil
	}
	// A container napd removes meanwhile is left out: the runtime prints
	// the others and fails for it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	text, err := r.cmd(ctx, append([]string{"container", "inspect"}, ids...)...)
	var out []ctr
	if jerr := json.Unmarshal([]byte(text), &out); jerr != nil {
		t.Fatalf("%v (%v)", jerr, err)
	}
	for i := range out {
		out[i].Name = strings.TrimPrefix(out[i].Name, "/")
	}
	return out
}

// ofModel is the containers of inst that run for model.
func (r *runtime) ofModel(t *testing.T, inst, model string) []ctr {
	t.Helper()
	var out []ctr
	for _, c := range r.containers(t, inst) {
		if c.Config.Labels["napd.model"] == model {
			out = append(out, c)
		}
	}
	return out
}

// removeAll removes every container of inst, whatever napd left.
func (r *runtime) removeAll(t *testing.T, inst string) {
	for _, c := range r.containers(t, inst) {
		r.must(t, "rm", "--force", c.ID)
	}
}

// The runtimes are set up once per test binary; teardown runs from TestMain.
var (
	setupMu   sync.Mutex
	podmanRT  *runtime
	podmanErr error
	dockerRT  *runtime
	dockerWhy string // why docker is skipped
	teardowns []func()
	workDir   string // under which each runtime keeps its state
	imageOnce sync.Once
	imageTar  string
	imageErr  error
)

// teardown stops the runtimes' daemons and removes their state, after
// every test of the binary ran.
func teardown() {
	setupMu.Lock()
	defer setupMu.Unlock()
	for i := len(teardowns) - 1; i >= 0; i-- {
		teardowns[i]()
	}
	if workDir != "" {
		unmountUnder(workDir)
		os.RemoveAll(workDir)
	}
}

// unmountUnder detaches what the runtimes left mounted under dir (their
// storage makes its overlay directory a private mount of its own), deepest
// first, so that the directory can be removed.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

func work(t *testing.T) string {
	t.Helper()
	if workDir == "" {
		dir, err := os.MkdirTemp("", "napd-ctr-")
		if err != nil {
			t.Fatal(err)
		}
		workDir = dir
	}
	return workDir
}

// image is the tarball of the engine image's root file system.
func image(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(ImageEnv); p != "" {
		return p
	}
	imageOnce.Do(func() {
		dir, err := os.MkdirTemp("", "napd-ctr-image-")
		if err != nil {
			imageErr = err
			return
		}
		teardowns = append(teardowns, func() { os.RemoveAll(dir) })
		root := filepath.Join(dir, "root")
		build := exec.Command("go", "build", "-o", filepath.Join(root, imageEngine), "./cmd/napd-demo-engine")
		build.Dir = harness.RepoRoot()
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			imageErr = fmt.Errorf("build the static engine: %v\n%s", err, out)
			return
		}
		imageTar = filepath.Join(dir, "img.tar")
		if out, err := exec.Command("tar", "-C", root, "-cf", imageTar, ".").CombinedOutput(); err != nil {
			imageErr = fmt.Errorf("tar: %v\n%s", err, out)
		}
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imageTar
}

// Podman is rootful podman with the settings these machines need (never
// napd's defaults for users): runc, as Debian 12's crun refuses the hybrid
// cgroup v1 of these kernels; default ulimits under the hard limits, as the
// sandbox lacks CAP_SYS_RESOURCE; storage and state of its own (in the
// systemd box also because overlayfs cannot stack on the box's overlay
// root: the work dir is on the box's tmpfs /tmp).
func Podman(t *testing.T) *runtime {
	t.Helper()
	setupMu.Lock()
	defer setupMu.Unlock()
	if podmanRT != nil || podmanErr != nil {
		if podmanErr != nil {
			t.Fatal(podmanErr)
		}
		return podmanRT
	}
	if os.Geteuid() != 0 {
		t.Skip("podman tests run rootful: not root")
	}
	if _, err := exec.LookPath("podman"); err != nil {
		podmanErr = fmt.Errorf("podman is not installed: run make test-deps")
		t.Fatal(podmanErr)
	}
	dir := filepath.Join(work(t), "podman")
	conf := fmt.Sprintf(`[engine]
runtime = "runc"
tmp_dir = %q
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
`, filepath.Join(dir, "tmp"))
	storage := fmt.Sprintf("[storage]\ndriver = \"overlay\"\ngraphroot = %q\nrunroot = %q\n", filepath.Join(dir, "graph"), filepath.Join(dir, "run"))
	for name, text := range map[string]string{"containers.conf": conf, "storage.conf": storage} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := &runtime{name: "podman", env: []string{
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := r.cmd(ctx, "import", image(t), Image); err != nil {
		podmanErr = err
		t.Fatal(err)
	}
	teardowns = append(teardowns, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := r.cmd(ctx, "rm", "--all", "--force"); err != nil {
			fmt.Fprintln(os.Stderr, "podman teardown:", err)
		}
	})
	podmanRT = r
	return r
}

// Docker is Debian's docker.io with a daemon of the tests' own (socket,
// data and exec roots in the work dir). On the host it has no bridge and
// changes no network setting (--iptables=false --bridge=none
// --ip-forward=false: the test machines share their network namespace); bridge says it may make one (the systemd box has its own
// network). The daemon's default ulimits stay under the sandbox's hard
// limits. Where it cannot start, docker's tests skip with the reason.
func Docker(t *testing.T, bridge bool) *runtime {
	t.Helper()
	setupMu.Lock()
	defer setupMu.Unlock()
	if dockerRT != nil {
		return dockerRT
	}
	if dockerWhy != "" {
		t.Skip(dockerWhy)
	}
	if os.Geteuid() != 0 {
		dockerWhy = "docker tests start a daemon: not root"
		t.Skip(dockerWhy)
	}
	for _, p := range []string{"docker", "dockerd"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is not installed: run make test-deps", p)
		}
	}
	dir := filepath.Join(work(t), "docker")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "docker.sock")
	args := []string{"--host", "unix://" + sock, "--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"), "--pidfile", filepath.Join(dir, "docker.pid"),
		"--default-ulimit", "nofile=4096:4096"}
	if !bridge {
		// Nor any change to the host's network settings.
		args = append(args, "--iptables=false", "--bridge=none", "--ip-forward=false")
	}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d := exec.Command("dockerd", args...)
	d.Stdout, d.Stderr = logf, logf
	// The daemon dies with the test binary; its containerd dies with it.
	d.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = d.Wait(); logf.Close(); close(exited) }()
	r := &runtime{name: "docker", env: []string{"DOCKER_HOST=unix://" + sock}}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if ids, err := r.cmd(ctx, "ps", "--all", "--quiet"); err == nil && strings.TrimSpace(ids) != "" {
			_, _ = r.cmd(ctx, append([]string{"rm", "--force"}, strings.Fields(ids)...)...)
		}
		_ = d.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = d.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.cmd(ctx, "version")
		cancel()
		if err == nil {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "dockerd.log"))
			dockerWhy = fmt.Sprintf("dockerd cannot start here: %s", lastLines(string(log), 5))
			fmt.Fprintln(os.Stderr, "tests/containers:", dockerWhy)
			t.Skip(dockerWhy)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			dockerWhy = fmt.Sprintf("dockerd does not answer within a minute: %v", err)
			fmt.Fprintln(os.Stderr, "tests/containers:", dockerWhy)
			t.Skip(dockerWhy)
		}
		time.Sleep(100 * time.Millisecond)
	}
	teardowns = append(teardowns, stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := r.cmd(ctx, "import", image(t), Image); err != nil {
		t.Fatal(err)
	}
	dockerRT = r
	return r
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
