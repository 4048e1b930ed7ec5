package supervisor_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/process"
)

// portStub is a PortCheck reporting holder as listening on the port, and
// recording the engine processes it was asked about.
type portStub struct {
	mu     sync.Mutex
	holder *supervisor.PortHolder
	asked  [][]int
}

func (p *portStub) check(port int, engine []int) ([]supervisor.PortHolder, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, engine)
	if p.holder == nil || slices.Contains(engine, p.holder.PID) {
		return nil, nil
	}
	return []supervisor.PortHolder{*p.holder}, nil
}

func newCheckedSupervisor(t *testing.T, ports supervisor.PortCheck) *supervisor.Supervisor {
	t.Helper()
	b, err := process.New(process.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s := supervisor.New(b, supervisor.Options{Ports: ports})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// A port held before the start: the wake fails with the holder named and
// the engine is never started.
func TestWake_PortHeldBeforeStart(t *testing.T) {
	stub := &portStub{holder: &supervisor.PortHolder{PID: 999, Name: "python3"}}
	s := newCheckedSupervisor(t, stub.check)
	spec := fakeEngine(freePort(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := s.Wake(ctx, spec)
	var pe *supervisor.PortError
	if !errors.As(err, &pe) || pe.Error() != "port "+strconv.Itoa(spec.Port)+" is held by pid 999 (python3), not by the engine of m" {
		t.Fatalf("Wake = %v, want the port error", err)
	}
	if o, _ := s.Observe(ctx, spec); o.Process.State == supervisor.ProcRunning {
		t.Error("the engine was started on a port another process holds")
	}
	if len(stub.asked) != 1 || stub.asked[0] != nil {
		t.Errorf("asked %v, want one check with no engine process", stub.asked)
	}
}

// After a wake only the engine's processes may listen; Observe says the
// same at reconciliation.
func TestWake_PortCheckedAfterHealth(t *testing.T) {
	stub := &portStub{}
	s := newCheckedSupervisor(t, stub.check)
	spec := fakeEngine(freePort(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	o, _ := s.Observe(ctx, spec)
	if o.State != supervisor.Awake || len(stub.asked) < 2 || len(stub.asked[1]) == 0 {
		t.Fatalf("observe %+v, asked %v: want awake, checked against the engine's processes", o, stub.asked)
	}
	if !slices.Equal(stub.asked[1], o.Process.PIDs) {
		t.Errorf("checked against %v, want the engine's %v", stub.asked[1], o.Process.PIDs)
	}

	stub.mu.Lock()
	stub.holder = &supervisor.PortHolder{UID: 65534} // another user's, napd cannot see it
	stub.mu.Unlock()
	o, _ = s.Observe(ctx, spec)
	want := "port " + strconv.Itoa(spec.Port) + " is held by a process of uid 65534 that napd cannot see, not by the engine of m"
	if o.State != supervisor.Unverified || o.Reason != want {
		t.Errorf("Observe = %+v, want unverified: %s", o, want)
	}
	var pe *supervisor.PortError
	if err := s.Wake(ctx, spec); !errors.As(err, &pe) {
		t.Errorf("Wake of the running engine = %v, want the port error", err)
	}
}

// ZMQ workers (a caller's verify) listen on no HTTP port: not checked.
func TestWakeVerified_PortNotCheckedForOtherTransports(t *testing.T) {
	stub := &portStub{holder: &supervisor.PortHolder{PID: 999, Name: "python3"}}
	s := newCheckedSupervisor(t, stub.check)
	spec := fakeEngine(freePort(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.WakeVerified(ctx, spec, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if len(stub.asked) != 0 {
		t.Errorf("port checked %d times", len(stub.asked))
	}
}
