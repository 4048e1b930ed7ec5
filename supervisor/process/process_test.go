//go:build linux

package process

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/gpuvendor"
	"github.com/napd/napd/internal/statefile"
	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/internal/fakeengine"
)

// envCrashingNapd makes the test binary play napd: start one engine with
// the exec backend in the named directory (its state_dir), an engine that
// spawns a grandchild, write the engine's PID to engine.pid and the
// grandchild's to grandchild.pid there, and wait to be killed.
const envCrashingNapd = "NAPD_TEST_CRASHING_NAPD"

func TestMain(m *testing.M) {
	fakeengine.MaybeRun()
	if dir := os.Getenv(envCrashingNapd); dir != "" {
		os.Exit(crashingNapd(dir))
	}
	os.Exit(m.Run())
}

func crashingNapd(dir string) int {
	b, err := New(Options{StateDir: dir})
	if err == nil {
		err = b.Start(context.Background(), supervisor.Spec{
			Model: "orphan", Command: []string{os.Args[0]},
			Environment: fakeengine.Env(map[string]string{fakeengine.EnvGrandchildPIDFile: filepath.Join(dir, "grandchild.pid")}),
		})
	}
	if err == nil {
		var st supervisor.Status
		st, err = b.Status(context.Background(), supervisor.Spec{Model: "orphan"})
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "engine.pid"), []byte(strconv.Itoa(st.PIDs[0])), 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {}
}

// fakeSpec runs this test binary as a fake engine configured by env.
func fakeSpec(t *testing.T, model string, env map[string]string) supervisor.Spec {
	t.Helper()
	return supervisor.Spec{Model: model, Command: []string{os.Args[0]}, Environment: fakeengine.Env(env), Health: "/health"}
}

func newBackend(t *testing.T, opts Options) *Backend {
	t.Helper()
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitEvent returns the next event for model in state, failing after a
// bounded wait.
func waitEvent(t *testing.T, ch <-chan supervisor.Event, model string, state supervisor.ProcState) supervisor.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event stream closed waiting for %s %s", model, state)
			}
			if ev.Model == model && ev.State == state {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s event for %s", state, model)
		}
	}
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	state, _, err := parseStat(b)
	return err == nil && state != 'Z' && state != 'X'
}

// readPIDFile waits, bounded, for the fake engine to write its grandchild's PID.
func readPIDFile(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			pid, err := strconv.Atoi(string(b))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

func waitHealthy(t *testing.T, port int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("engine never healthy")
}

func TestBackend_StartStatusStop(t *testing.T) {
	b := newBackend(t, Options{})
	port := freePort(t)
	spec := fakeSpec(t, "m1", map[string]string{fakeengine.EnvPort: strconv.Itoa(port)})
	ctx := context.Background()

	if err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, b.Events(), "m1", supervisor.ProcRunning); ev.Reason != "started" {
		t.Errorf("start event reason %q", ev.Reason)
	}
	waitHealthy(t, port)
	st, err := b.Status(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != supervisor.ProcRunning || len(st.PIDs) == 0 {
		t.Fatalf("status %+v, want running with pids", st)
	}
	if !st.HaveMemory || st.MemoryBytes <= 0 || !strings.HasPrefix(st.Reason, "memory: ") {
		t.Errorf("status memory %+v", st)
	}
	if running, _ := b.Running(ctx); !slices.Equal(running, []string{"m1"}) {
		t.Errorf("Running = %v", running)
	}
	// A second Start of a running engine is a no-op.
	if err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}

	if err := b.Stop(ctx, spec); err != nil {
		t.Fatal(err)
	}
	for _, pid := range st.PIDs {
		if alive(pid) {
			t.Errorf("pid %d alive after Stop", pid)
		}
	}
	ev := waitEvent(t, b.Events(), "m1", supervisor.ProcStopped)
	if ev.Reason != "signal: terminated" {
		t.Errorf("stop reason %q", ev.Reason)
	}
	st, _ = b.Status(ctx, spec)
	if st.State != supervisor.ProcStopped {
		t.Errorf("after Stop: %+v", st)
	}
	if running, _ := b.Running(ctx); len(running) != 0 {
		t.Errorf("Running after stop = %v", running)
	}
}

func TestBackend_ExitIsReportedWithStatus(t *testing.T) {
	b := newBackend(t, Options{})
	spec := fakeSpec(t, "crash", map[string]string{fakeengine.EnvExitAfter: "50ms", fakeengine.EnvExitCode: "3"})
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, b.Events(), "crash", supervisor.ProcFailed)
	if ev.Reason != "exit status 3" {
		t.Errorf("reason %q, want exit status 3", ev.Reason)
	}
	st, _ := b.Status(context.Background(), spec)
	if st.State != supervisor.ProcFailed || st.Reason != "exit status 3" {
		t.Errorf("status %+v", st)
	}
	// A failed engine starts again.
	spec.Environment[fakeengine.EnvExitAfter] = ""
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Status(context.Background(), spec); st.State != supervisor.ProcRunning {
		t.Errorf("restart: %+v", st)
	}
}

func TestBackend_StopEscalatesToSIGKILL(t *testing.T) {
	b := newBackend(t, Options{})
	pidFile := filepath.Join(t.TempDir(), "grandchild")
	spec := fakeSpec(t, "stubborn", map[string]string{
		fakeengine.EnvIgnoreTerm:        "1",
		fakeengine.EnvGrandchildPIDFile: pidFile,
	})
	spec.StopTimeout = 200 * time.Millisecond
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	grandchild := readPIDFile(t, pidFile)
	start := time.Now()
	if err := b.Stop(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < spec.StopTimeout {
		t.Errorf("Stop returned after %v, before the stop timeout", took)
	}
	ev := waitEvent(t, b.Events(), "stubborn", supervisor.ProcStopped)
	if ev.Reason != "signal: killed" {
		t.Errorf("reason %q, want signal: killed", ev.Reason)
	}
	if alive(grandchild) {
		t.Errorf("grandchild %d outlived Stop", grandchild)
	}
}

func TestBackend_StopCancelledKillsAtOnce(t *testing.T) {
	b := newBackend(t, Options{})
	port := freePort(t)
	spec := fakeSpec(t, "stubborn", map[string]string{fakeengine.EnvIgnoreTerm: "1", fakeengine.EnvPort: strconv.Itoa(port)})
	spec.StopTimeout = time.Hour
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, port) // SIGTERM is ignored from here on
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := b.Stop(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Status(context.Background(), spec); st.State != supervisor.ProcStopped || st.Reason != "signal: killed" {
		t.Errorf("status %+v", st)
	}
}

func TestBackend_LeaderExitKillsItsGroup(t *testing.T) {
	b := newBackend(t, Options{})
	pidFile := filepath.Join(t.TempDir(), "grandchild")
	spec := fakeSpec(t, "leader", map[string]string{
		fakeengine.EnvGrandchildPIDFile: pidFile,
		fakeengine.EnvExitAfter:         "300ms",
		fakeengine.EnvExitCode:          "1",
	})
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	grandchild := readPIDFile(t, pidFile)
	if ev := waitEvent(t, b.Events(), "leader", supervisor.ProcFailed); ev.Reason != "exit status 1" {
		t.Errorf("reason %q", ev.Reason)
	}
	if alive(grandchild) {
		t.Errorf("worker %d outlived its leader", grandchild)
	}
}

func TestBackend_CloseLeavesNoOrphans(t *testing.T) {
	b := newBackend(t, Options{})
	dir := t.TempDir()
	var pids []int
	for _, m := range []string{"a", "b"} {
		pidFile := filepath.Join(dir, m)
		spec := fakeSpec(t, m, map[string]string{
			fakeengine.EnvIgnoreTerm:        "1",
			fakeengine.EnvGrandchildPIDFile: pidFile,
		})
		spec.StopTimeout = 100 * time.Millisecond
		if err := b.Start(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
		st, _ := b.Status(context.Background(), spec)
		pids = append(pids, st.PIDs...)
		pids = append(pids, readPIDFile(t, pidFile))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d outlived Close", pid)
		}
	}
	for range b.Events() {
		// drain until closed
	}
	if err := b.Start(context.Background(), fakeSpec(t, "late", nil)); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestBackend_OutputCapturedAndRotated(t *testing.T) {
	const max = 10 << 10
	b := newBackend(t, Options{LogMaxBytes: max, LogKeep: 2})
	spec := fakeSpec(t, "chatty", map[string]string{
		fakeengine.EnvSpewBytes: "50000",
		fakeengine.EnvExitAfter: "10ms",
	})
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, b.Events(), "chatty", supervisor.ProcFailed)

	path := b.LogPath("chatty")
	if filepath.Dir(path) != filepath.Join(b.opts.StateDir, "logs") || filepath.Base(path) != "chatty.log" {
		t.Errorf("log path %s", path)
	}
	for _, p := range []string{path, path + ".1", path + ".2"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > max {
			t.Errorf("%s is %d bytes, over %d", p, st.Size(), max)
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("%s.3 kept beyond LogKeep: %v", path, err)
	}
	lines, err := b.Tail("chatty", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[1] != "--- napd: engine failed: exit status 0" || lines[0] != strings.Repeat("x", 99) {
		t.Errorf("tail = %q", lines)
	}
}

func TestBackend_EnvironmentReachesEngine(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify")
	t.Setenv("LISTEN_FDS", "3")
	b := newBackend(t, Options{})
	spec := fakeSpec(t, "env", map[string]string{
		fakeengine.EnvPrintEnv:  "CUDA_VISIBLE_DEVICES,NOTIFY_SOCKET,LISTEN_FDS,FROM_SPEC",
		fakeengine.EnvExitAfter: "10ms",
		"FROM_SPEC":             "yes",
	})
	spec.GPUs = []int{2, 0}
	spec.WorkingDirectory = t.TempDir()
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, b.Events(), "env", supervisor.ProcFailed)
	lines, err := b.Tail("env", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"CUDA_VISIBLE_DEVICES=2,0 (set=true)",
		"NOTIFY_SOCKET= (set=false)",
		"LISTEN_FDS= (set=false)",
		"FROM_SPEC=yes (set=true)",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("engine output lacks %q: %q", want, lines)
		}
	}
}

func TestBackend_User(t *testing.T) {
	b := newBackend(t, Options{})
	spec := supervisor.Spec{Model: "u", Command: []string{"/bin/sh", "-c", "id -u"}, User: "nobody", WorkingDirectory: "/"}
	err := b.Start(context.Background(), spec)
	if os.Geteuid() != 0 {
		if err == nil || !strings.Contains(err.Error(), "needs root") {
			t.Fatalf("Start as non-root with User: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(t, b.Events(), "u", supervisor.ProcFailed)
	lines, _ := b.Tail("u", 10)
	if !slices.Contains(lines, "65534") {
		t.Errorf("engine did not run as nobody: %q", lines)
	}
}

func TestBackend_StartErrors(t *testing.T) {
	b := newBackend(t, Options{})
	for name, spec := range map[string]supervisor.Spec{
		"unit only":    {Model: "x", Unit: "vllm.service"},
		"no binary":    {Model: "x", Command: []string{"/nonexistent/engine"}},
		"unknown user": {Model: "x", Command: []string{"/bin/true"}, User: "no-such-user-napd"},
	} {
		if err := b.Start(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "start x") {
			t.Errorf("%s: err %v", name, err)
		}
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New without state dir succeeded")
	}
}

func TestEnviron(t *testing.T) {
	got := environ([]string{"PATH=/bin", "NOTIFY_SOCKET=x", "WATCHDOG_USEC=1", "CUDA_VISIBLE_DEVICES=7", "A=base"},
		supervisor.Spec{Environment: map[string]string{"A": "spec", "LISTEN_PID": "1"}, GPUs: []int{0, 1}})
	want := []string{"A=spec", "CUDA_VISIBLE_DEVICES=0,1", "PATH=/bin"}
	if !slices.Equal(got, want) {
		t.Errorf("environ = %q, want %q", got, want)
	}
	// AMD's devices get ROCm's variables instead.
	got = environ(nil, supervisor.Spec{GPUs: []int{1}, Devices: []supervisor.GPU{{Vendor: gpuvendor.AMD, ID: "1", Node: "/dev/dri/renderD129"}}})
	if want := []string{"HIP_VISIBLE_DEVICES=0", "ROCR_VISIBLE_DEVICES=1"}; !slices.Equal(got, want) {
		t.Errorf("environ = %q, want %q", got, want)
	}
	// Without GPUs the inherited value stays.
	got = environ([]string{"CUDA_VISIBLE_DEVICES=7"}, supervisor.Spec{})
	if !slices.Equal(got, []string{"CUDA_VISIBLE_DEVICES=7"}) {
		t.Errorf("environ = %q", got)
	}
}

func TestLogName(t *testing.T) {
	for in, want := range map[string]string{"qwen3-8b": "qwen3-8b.log", "Qwen/Qwen3 8B": "Qwen_Qwen3_8B.log", "../x": ".._x.log"} {
		if got := logName(in); got != want {
			t.Errorf("logName(%q) = %q, want %q", in, got, want)
		}
	}
}

// crashNapd runs a napd with one engine and its grandchild in state_dir
// dir, and SIGKILLs it; it returns the PIDs of the engine and grandchild.
func crashNapd(t *testing.T, dir string) (engine, grandchild int) {
	t.Helper()
	napd := exec.Command(os.Args[0])
	napd.Env = append(os.Environ(), envCrashingNapd+"="+dir)
	napd.Stderr = os.Stderr
	if err := napd.Start(); err != nil {
		t.Fatal(err)
	}
	engine = readPIDFile(t, filepath.Join(dir, "engine.pid"))
	grandchild = readPIDFile(t, filepath.Join(dir, "grandchild.pid"))
	t.Cleanup(func() { _ = syscall.Kill(grandchild, syscall.SIGKILL) })
	if !alive(engine) {
		t.Fatal("engine not running")
	}
	// napd crashes: no Close, no Stop.
	if err := napd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = napd.Wait()
	return engine, grandchild
}

func TestBackend_EngineDiesWithCrashedNapd(t *testing.T) {
	engine, _ := crashNapd(t, t.TempDir())
	deadline := time.Now().Add(10 * time.Second)
	for alive(engine) {
		if time.Now().After(deadline) {
			syscall.Kill(engine, syscall.SIGKILL)
			t.Fatalf("engine %d outlived napd", engine)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// What an engine spawned survives a SIGKILLed napd (only the leader has
// Pdeathsig); the next napd's backend kills it before it starts anything.
func TestBackend_NewKillsRemainsOfCrashedNapd(t *testing.T) {
	dir := t.TempDir()
	engine, grandchild := crashNapd(t, dir)
	deadline := time.Now().Add(10 * time.Second)
	for alive(engine) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !alive(grandchild) {
		t.Fatal("the grandchild died with napd: the test shows nothing")
	}
	b := newBackend(t, Options{StateDir: dir})
	if alive(grandchild) {
		t.Fatalf("grandchild %d of the crashed napd's engine still runs after New", grandchild)
	}
	// Its record is gone with it: the next start finds nothing to do.
	if groups, err := loadGroups(b.groupsPath); err != nil || len(groups) != 0 {
		t.Errorf("groups after the clean-up: %v, %v", groups, err)
	}
}

// A record only kills processes it provably names: same boot, in the
// group, started no earlier than the leader, same user, and only from a
// file napd itself could have written.
func TestBackend_RemainsVerifiedBeforeKill(t *testing.T) {
	start := func(t *testing.T) (int, groupRecord) {
		t.Helper()
		cmd := exec.Command("sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		r, err := hostFS.record(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return cmd.Process.Pid, r
	}
	write := func(t *testing.T, dir string, r groupRecord, perm os.FileMode) {
		t.Helper()
		data, _ := json.Marshal(map[string]groupRecord{"m": r})
		if err := statefile.Write(filepath.Join(dir, groupsFile), data, perm); err != nil {
			t.Fatal(err)
		}
	}
	spare := func(name string, edit func(*groupRecord), perm os.FileMode) {
		t.Run(name, func(t *testing.T) {
			pid, r := start(t)
			edit(&r)
			dir := t.TempDir()
			write(t, dir, r, perm)
			newBackend(t, Options{StateDir: dir})
			if !alive(pid) {
				t.Errorf("process %d killed", pid)
			}
		})
	}
	spare("started before the leader", func(r *groupRecord) { r.Start++ }, 0o600)
	spare("another boot", func(r *groupRecord) { r.Boot = "0-0" }, 0o600)
	spare("another user", func(r *groupRecord) { r.UID++ }, 0o600)
	spare("untrusted file", func(*groupRecord) {}, 0o666)
	t.Run("verified", func(t *testing.T) {
		pid, r := start(t)
		dir := t.TempDir()
		write(t, dir, r, 0o600)
		newBackend(t, Options{StateDir: dir})
		if alive(pid) {
			t.Errorf("process %d of the recorded group survives", pid)
		}
	})
}

// A running engine is recorded, and the record goes when it exits.
func TestBackend_GroupRecordedWhileRunning(t *testing.T) {
	b := newBackend(t, Options{})
	spec := fakeSpec(t, "rec", nil)
	if err := b.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	st, _ := b.Status(context.Background(), spec)
	groups, err := loadGroups(b.groupsPath)
	if err != nil || groups["rec"].PGID != st.PIDs[0] {
		t.Fatalf("groups %v, %v; engine %v", groups, err, st.PIDs)
	}
	if err := b.Stop(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, b.Events(), "rec", supervisor.ProcStopped)
	if groups, err := loadGroups(b.groupsPath); err != nil || len(groups) != 0 {
		t.Errorf("groups after stop: %v, %v", groups, err)
	}
}

// A symlink a local user planted where an engine's log goes is not
// followed: the start fails and the symlink's target is untouched.
func TestBackend_PlantedLogSymlinkNotFollowed(t *testing.T) {
	b := newBackend(t, Options{})
	target := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(target, []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, b.LogPath("planted")); err != nil {
		t.Fatal(err)
	}
	spec := fakeSpec(t, "planted", map[string]string{fakeengine.EnvSpewBytes: "1000"})
	err := b.Start(context.Background(), spec)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("start with a planted log symlink: %v", err)
	}
	if data, _ := os.ReadFile(target); string(data) != "root:x:0:0\n" {
		t.Errorf("the symlink's target was written: %q", data)
	}
}

// The exec backend refuses a logs/ directory another user may write.
func TestBackend_RefusesUnsafeLogDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "logs"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "logs"), 0o777); err != nil {
		t.Fatal(err)
	}
	_, err := New(Options{StateDir: dir})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "logs")) || !strings.Contains(err.Error(), "rwxrwxrwx") {
		t.Errorf("New with a world-writable logs/: %v", err)
	}
}
