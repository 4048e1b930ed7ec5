package supervisor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/internal/fakeengine"
)

// WakeVerified starts the engine and lets the caller's check, not the
// health path, decide when it serves: the fake engine's health never
// passes here, yet the wake succeeds once verify says ready.
func TestExec_WakeVerifiedUsesTheCallersCheck(t *testing.T) {
	s := newExecSupervisor(t)
	spec := fakeEngine(freePort(t), map[string]string{fakeengine.EnvReadyAfter: "1h"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	calls := 0
	verify := func(ctx context.Context) error {
		calls++
		if o, err := s.Observe(ctx, spec); err != nil || o.Process.State != supervisor.ProcRunning {
			return errors.New("verify ran before the engine was started")
		}
		return nil
	}
	if err := s.WakeVerified(ctx, spec, verify); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("verify called %d times, want 1", calls)
	}
	// Waking a running engine verifies it again without a second start.
	if err := s.WakeVerified(ctx, spec, verify); err != nil || calls != 2 {
		t.Fatalf("second wake = %v, verify calls %d", err, calls)
	}

	notReady := errors.New("worker reports failed: out of memory")
	err := s.WakeVerified(ctx, spec, func(context.Context) error { return notReady })
	if !errors.Is(err, notReady) {
		t.Errorf("WakeVerified = %v, want the check's error", err)
	}
}

// An engine that exits while the caller's check waits ends the wake at
// once with the exit, whatever the check was doing.
func TestExec_WakeVerifiedEndsOnExit(t *testing.T) {
	s := newExecSupervisor(t)
	spec := fakeEngine(freePort(t), map[string]string{
		fakeengine.EnvReadyAfter: "1h",
		fakeengine.EnvExitAfter:  "200ms",
		fakeengine.EnvExitCode:   "3",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	err := s.WakeVerified(ctx, spec, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	var exit *supervisor.ExitError
	if !errors.As(err, &exit) || exit.Reason != "exit status 3" {
		t.Fatalf("WakeVerified = %v, want the engine's exit status 3", err)
	}
}
