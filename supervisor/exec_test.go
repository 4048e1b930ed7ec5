package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/internal/fakeengine"
	"github.com/napd/napd/supervisor/process"
)

// These tests run the Supervisor over the exec backend with real processes:
// this test binary as a fake engine, and the real napd-demo-engine.

func TestMain(m *testing.M) {
	fakeengine.MaybeRun()
	os.Exit(m.Run())
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

func newExecSupervisor(t *testing.T) *supervisor.Supervisor {
	t.Helper()
	b, err := process.New(process.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s := supervisor.New(b, supervisor.Options{})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func fakeEngine(port int, env map[string]string) supervisor.Spec {
	e := fakeengine.Env(env)
	e[fakeengine.EnvPort] = strconv.Itoa(port)
	return supervisor.Spec{
		Model: "m", Command: []string{os.Args[0]}, Port: port, Environment: e,
		Health: "/health", Sleep: "stop", StopTimeout: time.Second,
	}
}

func TestExec_WakeVerifiesHealthThenSleepStops(t *testing.T) {
	s := newExecSupervisor(t)
	spec := fakeEngine(freePort(t), map[string]string{fakeengine.EnvReadyAfter: "300ms"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// Only a verified engine counts as awake: health must pass right now.
	resp, err := http.Get(spec.BaseURL() + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("engine not healthy after Wake: %v %v", resp, err)
	}
	resp.Body.Close()
	if o, _ := s.Observe(ctx, spec); o.State != supervisor.Awake {
		t.Errorf("Observe = %+v", o)
	}
	if err := s.Sleep(ctx, spec, "stop"); err != nil {
		t.Fatal(err)
	}
	if o, _ := s.Observe(ctx, spec); o.State != supervisor.Stopped {
		t.Errorf("Observe after stop = %+v", o)
	}
	// The stop's own exit event does not fail the next wake.
	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
}

func TestExec_CrashDuringWakeFailsAtOnce(t *testing.T) {
	s := newExecSupervisor(t)
	spec := fakeEngine(freePort(t), map[string]string{
		fakeengine.EnvReadyAfter: "1h",
		fakeengine.EnvExitAfter:  "200ms",
		fakeengine.EnvExitCode:   "1",
	})
	// A wake_timeout far beyond the test: only the exit can end it in time.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	err := s.Wake(ctx, spec)
	var exit *supervisor.ExitError
	if !errors.As(err, &exit) || exit.Reason != "exit status 1" || exit.State != supervisor.ProcFailed {
		t.Fatalf("Wake = %v, want the engine's exit status 1", err)
	}
	if o, _ := s.Observe(context.Background(), spec); o.State != supervisor.Stopped || !strings.Contains(o.Reason, "exit status 1") {
		t.Errorf("Observe = %+v", o)
	}
}

func TestExec_EventsPassThrough(t *testing.T) {
	s := newExecSupervisor(t)
	spec := fakeEngine(freePort(t), nil)
	ctx := context.Background()
	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := s.Sleep(ctx, spec, "stop"); err != nil {
		t.Fatal(err)
	}
	var states []supervisor.ProcState
	for ev := range s.Events() {
		states = append(states, ev.State)
		if len(states) == 2 {
			break
		}
	}
	if !slices.Equal(states, []supervisor.ProcState{supervisor.ProcRunning, supervisor.ProcStopped}) {
		t.Errorf("events %v", states)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range s.Events() {
		// closed by Close
	}
}

// buildDemoEngine builds cmd/napd-demo-engine into a temp dir.
func buildDemoEngine(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "napd-demo-engine")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/napd/napd/cmd/napd-demo-engine")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build napd-demo-engine: %v\n%s", err, out)
	}
	return bin
}

type controlRequest struct {
	Method, Path, Query, Body string
}

func controlRequests(t *testing.T, spec supervisor.Spec) []string {
	t.Helper()
	resp, err := http.Get(spec.BaseURL() + "/debug/requests")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var reqs []controlRequest
	if err := json.NewDecoder(resp.Body).Decode(&reqs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range reqs {
		line := r.Method + " " + r.Path
		if r.Query != "" {
			line += "?" + r.Query
		}
		if r.Body != "" {
			line += " " + r.Body
		}
		out = append(out, line)
	}
	return out
}

func TestExec_DemoEngineSleepStrategies(t *testing.T) {
	bin := buildDemoEngine(t)
	s := newExecSupervisor(t)
	port := freePort(t)
	spec := supervisor.Spec{
		Model:       "demo",
		Command:     []string{bin, "--sleep-mode", "--port", strconv.Itoa(port), "--startup-delay", "200ms"},
		Port:        port,
		Health:      "/health",
		Sleep:       "vllm-l2",
		StopTimeout: 5 * time.Second,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := s.Sleep(ctx, spec, "vllm-l2"); err != nil {
		t.Fatal(err)
	}
	if o, _ := s.Observe(ctx, spec); o.State != supervisor.Asleep {
		t.Errorf("Observe asleep = %+v", o)
	}
	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := s.Sleep(ctx, spec, "sglang"); err != nil {
		t.Fatal(err)
	}
	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	want := []string{
		// Wake: a fresh start needs no wake; the first Wake asks nothing.
		"POST /sleep?level=2", "GET /is_sleeping",
		"GET /is_sleeping", // Observe
		"GET /is_sleeping", // Wake: does it sleep?
		"POST /wake_up?tags=weights",
		`POST /collective_rpc {"method":"reload_weights"}`,
		"POST /wake_up?tags=kv_cache",
		"POST /reset_prefix_cache",
		"GET /is_sleeping",
		"POST /release_memory_occupation {}",
		"POST /resume_memory_occupation {}",
	}
	if got := controlRequests(t, spec); !slices.Equal(got, want) {
		t.Errorf("demo engine saw\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestExec_ConcurrentWakesOnlyTheCrashedOneFails(t *testing.T) {
	s := newExecSupervisor(t)
	good := fakeEngine(freePort(t), map[string]string{fakeengine.EnvReadyAfter: "300ms"})
	good.Model = "good"
	bad := fakeEngine(freePort(t), map[string]string{fakeengine.EnvReadyAfter: "1h", fakeengine.EnvExitAfter: "100ms", fakeengine.EnvExitCode: "2"})
	bad.Model = "bad"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for _, spec := range []supervisor.Spec{good, bad} {
		go func() { errs <- s.Wake(ctx, spec) }()
	}
	var failed []string
	for range 2 {
		if err := <-errs; err != nil {
			failed = append(failed, err.Error())
		}
	}
	if !slices.Equal(failed, []string{"wake bad: engine failed during wake: exit status 2"}) {
		t.Errorf("failures %q", failed)
	}
}
