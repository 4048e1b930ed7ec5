package containers

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/container"
	"github.com/napd/napd/supervisor/process"
	"github.com/napd/napd/tests/harness"
)

// The container backend itself, under the race detector, with the real
// runtimes: a wake while others ask for the engine's status, the
// processes and memory it reports, an engine that dies (its waiter tells
// the exit code), and Close with an engine running (its container goes).
func TestBackend_Podman(t *testing.T) {
	onHost(t)
	t.Parallel()
	backendLife(t, Podman(t))
}

func TestBackend_Docker(t *testing.T) {
	onHost(t)
	t.Parallel()
	backendLife(t, Docker(t, false))
}

func backendLife(t *testing.T, rt *runtime) {
	program, err := exec.LookPath(rt.name)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inner, err := process.New(process.Options{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := container.New(ctx, inner, container.Options{StateDir: dir, Environ: append(os.Environ(), rt.env...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.removeAll(t, b.Instance()) })
	sup := supervisor.New(b, supervisor.Options{})
	closed := false
	t.Cleanup(func() {
		if !closed {
			sup.Close()
		}
	})
	events := make(chan supervisor.Event, 64)
	go func() {
		for ev := range sup.Events() {
			events <- ev
		}
		close(events)
	}()

	port := harness.FreePort(t)
	model := "bk-" + rt.name
	spec := supervisor.Spec{
		Model:   model,
		Command: []string{imageEngine, "--port", strconv.Itoa(port), "--model", model},
		Port:    port, Health: "/health", Sleep: "stop", StopTimeout: 5 * time.Second,
		Container: &supervisor.Container{Runtime: rt.name, Program: program, Image: Image, Pull: "never"},
	}

	var asking sync.WaitGroup
	done := make(chan struct{})
	asking.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := sup.Status(ctx, spec); err != nil {
				t.Errorf("status during the wake: %v", err)
				return
			}
		}
	})
	err = sup.Wake(ctx, spec)
	close(done)
	asking.Wait()
	if err != nil {
		t.Fatal(err)
	}
	st, err := sup.Status(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(rt.must(t, "container", "inspect", "--format", "{{.State.Pid}}", container.Name(model))))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != supervisor.ProcRunning || !slices.Contains(st.PIDs, pid) || !st.HaveMemory || st.MemoryBytes <= 0 {
		t.Fatalf("status of the awake container: %+v (engine pid %d)", st, pid)
	}

	// The engine dies: the waiter reports how.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, events, model, supervisor.ProcFailed)
	if ev.Reason != "exit code 137" {
		t.Errorf("a killed engine's exit: %q", ev.Reason)
	}
	if st, _ := sup.Status(ctx, spec); st.State != supervisor.ProcFailed || st.Reason != "exit code 137" {
		t.Errorf("status after the crash: %+v", st)
	}

	// A wake starts a fresh container in its place; Close stops it.
	if err := sup.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if cs := rt.ofModel(t, b.Instance(), model); len(cs) != 1 || cs[0].State.Status != "running" {
		t.Fatalf("after the crash and a wake: %+v", cs)
	}
	closed = true
	if err := sup.Close(); err != nil {
		t.Fatal(err)
	}
	if cs := rt.ofModel(t, b.Instance(), model); len(cs) != 0 {
		t.Fatalf("after Close: %+v", cs)
	}
	for range events { // closed by Close
	}
}

func waitEvent(t *testing.T, events <-chan supervisor.Event, model string, state supervisor.ProcState) supervisor.Event {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case ev := <-events:
			if ev.Model == model && ev.State == state {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event of %s within a minute", state, model)
		}
	}
}
