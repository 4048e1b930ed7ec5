//go:build linux

// Package systemd_test runs the systemd backend against a real systemd in a
// box (tests/systemd/box). The host test boots the box and runs this same
// test binary inside it with NAPD_IN_BOX=1, which enables the TestInBox_*
// tests; the binary also serves as the engine (NAPD_TEST_ENGINE).
package systemd_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/systemd"
	"github.com/napd/napd/tests/systemd/box"
)

const (
	inBoxEnv  = "NAPD_IN_BOX"
	engineEnv = "NAPD_TEST_ENGINE" // "serve": /health on $PORT; "exit1": exit 1 soon
	boxExe    = box.SharedPath + "/bin/systemd.test"
)

func TestMain(m *testing.M) {
	switch os.Getenv(engineEnv) {
	case "serve":
		http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
		fmt.Fprintln(os.Stderr, http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil))
		os.Exit(2)
	case "spawn":
		// A worker the engine spawns, as vLLM does; it ignores SIGTERM.
		child := exec.Command("sh", "-c", "trap '' TERM; exec sleep 600")
		if err := child.Start(); err != nil {
			os.Exit(3)
		}
		if err := os.WriteFile(os.Getenv("PIDFILE"), []byte(fmt.Sprint(child.Process.Pid)), 0o644); err != nil {
			os.Exit(3)
		}
		http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
		fmt.Fprintln(os.Stderr, http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil))
		os.Exit(2)
	case "exit1":
		time.Sleep(300 * time.Millisecond)
		os.Exit(1)
	case "probe":
		// Exit 0 when $URL answers 200: reachability from a namespace.
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(os.Getenv("URL"))
		if err != nil || resp.StatusCode != http.StatusOK {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestBackendInBox boots a box and runs the TestInBox_* tests inside it.
func TestBackendInBox(t *testing.T) {
	if os.Getenv(inBoxEnv) == "1" {
		t.Skip("already in the box")
	}
	b := box.Boot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(b.Shared(), "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := b.CopyIn(exe, boxExe); err != nil {
		t.Fatal(err)
	}
	err = b.InstallUnit(ctx, "napd-test-operator.service", "[Unit]\nDescription=operator-owned engine\n"+
		"[Service]\nEnvironment=NAPD_TEST_ENGINE=serve PORT=18003\nExecStart="+boxExe+"\n")
	if err != nil {
		t.Fatal(err)
	}
	installIsolation(t, ctx, b)
	args := []string{"env", inBoxEnv + "=1", boxExe, "-test.run", "^TestInBox_", "-test.count=1"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	cmd := b.Command(ctx, args...)
	out, err := cmd.CombinedOutput()
	t.Logf("in the box:\n%s", out)
	if err != nil {
		t.Fatalf("in-box tests failed: %v", err)
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatal("in-box tests did not run")
	}
}

func inBox(t *testing.T) (context.Context, *systemd.Backend) {
	t.Helper()
	if os.Getenv(inBoxEnv) != "1" {
		t.Skip("runs inside the systemd box (TestBackendInBox)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if ok, why := systemd.Probe(ctx); !ok {
		t.Fatalf("Probe in the box: %s", why)
	}
	be, err := systemd.New(ctx, systemd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return ctx, be
}

func engineSpec(model string, port int, mode string) supervisor.Spec {
	return supervisor.Spec{
		Model:       model,
		Command:     []string{boxExe, "-test.run", "^$"},
		Port:        port,
		Environment: map[string]string{engineEnv: mode, "PORT": fmt.Sprint(port)},
		Health:      "/health",
		StopTimeout: 5 * time.Second,
	}
}

func show(t *testing.T, unit string, props ...string) map[string]string {
	t.Helper()
	args := []string{"show", unit}
	for _, p := range props {
		args = append(args, "-p", p)
	}
	out, err := execOut("systemctl", args...)
	if err != nil {
		t.Fatalf("systemctl show: %v", err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		m[k] = v
	}
	return m
}

func healthy(spec supervisor.Spec) bool {
	c := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := c.Get(spec.BaseURL() + spec.Health)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func waitHealthy(t *testing.T, spec supervisor.Spec) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !healthy(spec) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy after 10s", spec.Model)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEvent reads events until one for model in state arrives.
func waitEvent(t *testing.T, be *systemd.Backend, model string, state supervisor.ProcState) supervisor.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-be.Events():
			if !ok {
				t.Fatal("events closed")
			}
			if ev.Model == model && ev.State == state {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event for %s within 10s", state, model)
		}
	}
}

func TestInBox_TransientUnitLifecycle(t *testing.T) {
	ctx, be := inBox(t)
	spec := engineSpec("alpha", 18001, "serve")
	spec.GPUs = []int{0, 1}
	spec.WorkingDirectory = "/tmp"
	t.Cleanup(func() { be.Stop(context.Background(), spec) })

	if err := be.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	p := show(t, "napd-engine-alpha.service", "ExecStart", "Environment", "KillMode", "Description",
		"TimeoutStopUSec", "CollectMode", "MemoryAccounting", "WorkingDirectory", "Type", "StandardOutput")
	for k, want := range map[string]string{
		"Description":      "napd engine for model alpha",
		"KillMode":         "mixed",
		"TimeoutStopUSec":  "5s",
		"CollectMode":      "inactive-or-failed",
		"MemoryAccounting": "yes",
		"WorkingDirectory": "/tmp",
		"Type":             "exec",
		"StandardOutput":   "journal",
		"Environment":      "CUDA_VISIBLE_DEVICES=0,1 NAPD_TEST_ENGINE=serve PORT=18001",
	} {
		if p[k] != want {
			t.Errorf("%s = %q, want %q", k, p[k], want)
		}
	}
	if !strings.Contains(p["ExecStart"], "path="+boxExe) || !strings.Contains(p["ExecStart"], "ignore_errors=no") {
		t.Errorf("ExecStart = %q", p["ExecStart"])
	}
	waitEvent(t, be, "alpha", supervisor.ProcRunning)
	waitHealthy(t, spec)

	st, err := be.Status(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != supervisor.ProcRunning || len(st.PIDs) == 0 || !st.HaveMemory || st.MemoryBytes <= 0 ||
		st.Unit != "napd-engine-alpha.service" {
		t.Errorf("status = %+v", st)
	}
	if running, err := be.Running(ctx); err != nil || !slices.Contains(running, "alpha") {
		t.Errorf("Running = %v, %v", running, err)
	}
	// Starting an active unit again is a no-op.
	if err := be.Start(ctx, spec); err != nil {
		t.Fatalf("second Start: %v", err)
	}

	if err := be.Stop(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, be, "alpha", supervisor.ProcStopped); ev.Reason != "" {
		t.Errorf("clean stop has reason %q", ev.Reason)
	}
	if st, err := be.Status(ctx, spec); err != nil || st.State != supervisor.ProcStopped {
		t.Errorf("status after stop = %+v, %v", st, err)
	}
	if healthy(spec) {
		t.Error("engine still answers after Stop")
	}
	// Stopping a stopped engine is fine.
	if err := be.Stop(ctx, spec); err != nil {
		t.Errorf("second Stop: %v", err)
	}

	if err := be.Start(ctx, spec); err != nil {
		t.Fatalf("restart: %v", err)
	}
	waitHealthy(t, spec)
}

func TestInBox_FailureReportedWithSystemdReason(t *testing.T) {
	ctx, be := inBox(t)
	spec := engineSpec("beta", 18002, "exit1")
	for i := range 2 { // twice: a failed transient unit can be created again
		if err := be.Start(ctx, spec); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		ev := waitEvent(t, be, "beta", supervisor.ProcFailed)
		if ev.Reason != "exit-code (status=1)" {
			t.Errorf("failure reason = %q, want exit-code (status=1)", ev.Reason)
		}
	}

	missing := supervisor.Spec{Model: "gone", Command: []string{"/nonexistent/engine"}}
	err := be.Start(ctx, missing)
	var jerr *systemd.JobError
	if !errors.As(err, &jerr) || jerr.Result != "failed" || jerr.Unit != "napd-engine-gone.service" {
		t.Fatalf("start of a missing binary: %v", err)
	}
	if !strings.Contains(jerr.Reason, "exit-code (status=203)") {
		t.Errorf("reason = %q, want systemd's EXEC failure", jerr.Reason)
	}
}

func TestInBox_ReconcileAfterRestart(t *testing.T) {
	ctx, be := inBox(t)
	gamma, delta := engineSpec("gamma", 18004, "serve"), engineSpec("delta", 18005, "serve")
	for _, s := range []supervisor.Spec{gamma, delta} {
		if err := be.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	be.Close()
	// Units survive their supervisor.
	waitHealthy(t, gamma)
	waitHealthy(t, delta)

	be2, err := systemd.New(ctx, systemd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be2.Close()
	t.Cleanup(func() { be2.Stop(context.Background(), gamma) })
	running, err := be2.Running(ctx)
	if err != nil || !slices.Equal(running, []string{"delta", "gamma"}) {
		t.Fatalf("Running after restart = %v, %v", running, err)
	}
	stopped, err := be2.StopUnknown(ctx, []string{"gamma", "alpha"})
	if err != nil || !slices.Equal(stopped, []string{"delta"}) {
		t.Fatalf("StopUnknown = %v, %v", stopped, err)
	}
	if healthy(delta) {
		t.Error("unknown model's engine still runs")
	}
	if st, err := be2.Status(ctx, gamma); err != nil || st.State != supervisor.ProcRunning {
		t.Errorf("kept model: %+v, %v", st, err)
	}
}

func TestInBox_OperatorUnit(t *testing.T) {
	ctx, be := inBox(t)
	spec := supervisor.Spec{Model: "op", Unit: "napd-test-operator.service", Port: 18003, Health: "/health"}
	if err := be.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, be, "op", supervisor.ProcRunning)
	waitHealthy(t, spec)
	if st, err := be.Status(ctx, spec); err != nil || st.State != supervisor.ProcRunning || st.Unit != spec.Unit {
		t.Errorf("status = %+v, %v", st, err)
	}
	if err := be.Stop(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, be, "op", supervisor.ProcStopped)
	if out, _ := execOut("systemctl", "is-active", spec.Unit); strings.TrimSpace(out) != "inactive" {
		t.Errorf("operator unit is %q after Stop", out)
	}
}

// A napd that dies (nothing stopped, as with SIGKILL) leaves its engine
// unit to systemd; the next napd adopts it, and stopping it ends every
// process of its cgroup, the worker it spawned included.
func TestInBox_CrashedNapdLeavesNothingUnmanaged(t *testing.T) {
	ctx, be := inBox(t)
	spec := engineSpec("eps", 18006, "spawn")
	pidFile := filepath.Join(t.TempDir(), "worker.pid")
	spec.Environment["PIDFILE"] = pidFile
	if err := be.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, spec)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var worker int
	fmt.Sscan(string(b), &worker)
	be.Close() // napd is gone; systemd keeps the unit

	be2, err := systemd.New(ctx, systemd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be2.Close()
	if running, err := be2.Running(ctx); err != nil || !slices.Contains(running, "eps") {
		t.Fatalf("the restarted napd does not find the engine: %v, %v", running, err)
	}
	st, err := be2.Status(ctx, spec)
	if err != nil || !slices.Contains(st.PIDs, worker) {
		t.Fatalf("the adopted engine's processes %v (%v) lack its worker %d", st.PIDs, err, worker)
	}
	if err := be2.Stop(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// Stop returns once the unit is inactive, its cgroup empty; the box's
	// init may take a moment to reap the worker.
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(worker, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the engine's worker %d outlived the stop", worker)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
