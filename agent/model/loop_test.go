package model

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/internal/fakeclock"
	"github.com/napd/napd/probes/sockets"
	"github.com/napd/napd/request"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

// These tests drive one model's loop with a fake supervisor, whose calls
// the test answers one by one, and a clock the test advances by hand. Each
// step is observed through what the loop does (a supervisor call, an
// event, a grant), or through Ping, which returns once the loop has
// handled everything posted before it: nothing waits on a fixed sleep.

// within bounds every wait for the loop; it is never slept.
const within = 20 * time.Second

// call is one supervisor call the test answers.
type call struct {
	op       string // "wake" or "sleep"
	spec     supervisor.Spec
	strategy string
	ctx      context.Context
	reply    chan error
}

// fakeSupervisor hands every wake and sleep to the test on calls.
type fakeSupervisor struct {
	calls   chan call
	observe supervisor.Observed
}

func (f *fakeSupervisor) do(ctx context.Context, c call) error {
	c.ctx, c.reply = ctx, make(chan error, 1)
	f.calls <- c
	select {
	case err := <-c.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeSupervisor) WakeVerified(ctx context.Context, spec supervisor.Spec, _ supervisor.Verify) error {
	return f.do(ctx, call{op: "wake", spec: spec})
}

func (f *fakeSupervisor) Sleep(ctx context.Context, spec supervisor.Spec, strategy string) error {
	return f.do(ctx, call{op: "sleep", spec: spec, strategy: strategy})
}

func (f *fakeSupervisor) Observe(context.Context, supervisor.Spec) (supervisor.Observation, error) {
	return supervisor.Observation{State: f.observe}, nil
}

func (f *fakeSupervisor) UnitName(supervisor.Spec) string { return "" }

// rig is one model under test.
type rig struct {
	t      testing.TB
	m      *Model
	sup    *fakeSupervisor
	clock  *fakeclock.Clock
	events chan control.Event
	cfg    *config.Model
	probes chan chan ProbeResult // each health probe, answered by the test
}

func testConfig(name string) *config.Model {
	return &config.Model{
		Name: name, Transport: config.TransportHTTP, Sleep: sleepmode.Stop,
		MaxConcurrency: 1, Queue: 1,
		WakeTimeout: time.Minute, WakeAttempts: 3, DrainTimeout: 30 * time.Second,
		StopTimeout: time.Second, IdleTimeout: time.Hour,
		ArrivalWhileDraining: lifecycle.ArrivalCancelDrain,
	}
}

func specFor(cfg *config.Model, port int) supervisor.Spec {
	return supervisor.Spec{Model: cfg.Name, Command: cfg.Command, Environment: cfg.Environment, GPUs: cfg.GPUs,
		Port: port, Sleep: cfg.Sleep, StopTimeout: cfg.StopTimeout}
}

// newRig starts a model whose engine the supervisor finds in state found.
func newRig(t testing.TB, found supervisor.Observed, tune func(*config.Model)) *rig {
	t.Helper()
	return newRigWith(t, found, tune, nil)
}

// newRigWith is newRig with deps changed by with (e.g. MakeRoom).
func newRigWith(t testing.TB, found supervisor.Observed, tune func(*config.Model), with func(*Deps)) *rig {
	t.Helper()
	cfg := testConfig("m")
	if tune != nil {
		tune(cfg)
	}
	r := &rig{
		t: t, cfg: cfg,
		sup:    &fakeSupervisor{calls: make(chan call, 16), observe: found},
		clock:  fakeclock.New(time.Unix(1_800_000_000, 0)),
		events: make(chan control.Event, 1024),
		probes: make(chan chan ProbeResult, 16),
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := Deps{
		Tracker:    lease.NewTracker(lease.Options{}),
		Supervisor: r.sup,
		Metrics:    metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} }),
		Emit:       func(e control.Event) { r.events <- e },
		Clock:      r.clock.Now,
		MakeRoom:   func(context.Context, string, func(string)) ([]int, error) { return nil, nil },
		Probe: func(ctx context.Context, _ supervisor.Spec, _ *config.Model) ProbeResult {
			reply := make(chan ProbeResult, 1)
			r.probes <- reply
			select {
			case res := <-reply:
				return res
			case <-ctx.Done():
				return ProbeResult{Err: ctx.Err()}
			}
		},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ctx: ctx,
	}
	if with != nil {
		with(&d)
	}
	r.m = New(d, cfg, specFor(cfg, cmp.Or(cfg.Port, 8001)))
	go r.m.Run()
	t.Cleanup(func() {
		cancel()
		r.m.Shutdown()
		<-r.m.Done()
	})
	r.m.Observe(context.Background())
	return r
}

// sync returns once the loop handled everything posted so far.
func (r *rig) sync() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := r.m.Ping(ctx); err != nil {
		r.t.Fatalf("loop does not answer: %v", err)
	}
}

// state is the model's lifecycle state once the loop is idle.
func (r *rig) state() lifecycle.State {
	r.sync()
	return r.m.Snapshot().Lifecycle.State
}

// expect fails the test unless the model is in state want.
func (r *rig) expect(want lifecycle.State) {
	r.t.Helper()
	if st := r.state(); st != want {
		r.t.Fatalf("state %v, want %v", st, want)
	}
}

// until waits for the published snapshot to satisfy ok, one loop round
// trip at a time.
func (r *rig) until(what string, ok func(Snapshot) bool) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for !ok(r.m.Snapshot()) {
		if time.Now().After(deadline) {
			r.t.Fatalf("waiting for %s: snapshot %+v", what, r.m.Snapshot())
		}
		r.sync()
	}
}

// next is the supervisor's next call, which must be op.
func (r *rig) next(op string) call {
	r.t.Helper()
	select {
	case c := <-r.sup.calls:
		if c.op != op {
			r.t.Fatalf("supervisor call %s %+v, want %s", c.op, c.spec, op)
		}
		return c
	case <-time.After(within):
		r.t.Fatalf("no %s call", op)
	}
	return call{}
}

// noCall fails when the supervisor was called (after syncing the loop).
func (r *rig) noCall() {
	r.t.Helper()
	r.sync()
	select {
	case c := <-r.sup.calls:
		r.t.Fatalf("unexpected supervisor call %s %+v", c.op, c.spec)
	default:
	}
}

// waitEvent waits for an event of kind (and, for "state", To == to).
func (r *rig) waitEvent(kind control.EventKind, to string) control.Event {
	r.t.Helper()
	timeout := time.After(within)
	for {
		select {
		case e := <-r.events:
			if e.Kind == kind && (to == "" || e.To == to) {
				return e
			}
		case <-timeout:
			r.t.Fatalf("no %s event to %q", kind, to)
		}
	}
}

// operatorSleep runs an operator sleep (the model's own strategy) on its
// own goroutine; its result comes on the channel.
func (r *rig) operatorSleep() <-chan error {
	slept := make(chan error, 1)
	go func() { slept <- r.m.Sleep(context.Background(), "") }()
	return slept
}

// admission is one Admit running on its own goroutine.
type admission struct {
	ticket *gateway.Ticket
	err    error
	done   chan struct{}
}

func (r *rig) admit(ctx context.Context) *admission {
	a := &admission{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.ticket, a.err = r.m.Admit(ctx, lease.Request{Model: "m", Kind: request.Chat})
	}()
	return a
}

// result waits for the admission's outcome.
func (a *admission) result(t testing.TB) (*gateway.Ticket, error) {
	t.Helper()
	select {
	case <-a.done:
		return a.ticket, a.err
	case <-time.After(within):
		t.Fatal("admission did not end")
	}
	return nil, nil
}

func (a *admission) pending() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// granted waits for the admission and fails unless it was granted.
func (r *rig) granted(a *admission) *gateway.Ticket {
	r.t.Helper()
	tk, err := a.result(r.t)
	if err != nil || tk == nil || tk.Target == nil {
		r.t.Fatalf("admission: ticket %+v, err %v", tk, err)
	}
	return tk
}

// An awake model grants up to max_concurrency at once, queues up to queue
// in FIFO order, refuses the rest with 503 queue_full, and grants the
// queued request when a slot frees.
func TestAdmissionAndQueue(t *testing.T) {
	r := newRig(t, supervisor.Awake, nil)
	r.expect(lifecycle.Awake)
	ctx := context.Background()
	first := r.granted(r.admit(ctx))
	if first.Target.Host != "127.0.0.1:8001" || first.WakeWait != 0 {
		t.Errorf("first ticket: target %v, wake wait %v", first.Target, first.WakeWait)
	}
	second := r.admit(ctx)
	r.until("one queued", func(s Snapshot) bool { return s.QueueDepth == 1 })
	_, err := r.admit(ctx).result(t)
	var ref *gateway.Refusal
	if !errors.As(err, &ref) || ref.Status != http.StatusServiceUnavailable || ref.Code != "queue_full" {
		t.Fatalf("third admission: %v, want 503 queue_full", err)
	}
	if !second.pending() {
		t.Fatal("the queued request was granted while the slot was taken")
	}
	first.Done(gateway.Outcome{})
	tk := r.granted(second)
	r.sync()
	if s := r.m.Snapshot(); s.Active != 1 || s.QueueDepth != 0 {
		t.Errorf("after the grant: active %d, queue %d", s.Active, s.QueueDepth)
	}
	tk.Done(gateway.Outcome{})
	r.until("slots free", func(s Snapshot) bool { return s.Active == 0 })
	r.noCall()
}

// A queued request whose client leaves is withdrawn: it holds no queue
// place and its lease ends.
func TestAdmissionWithdrawn(t *testing.T) {
	r := newRig(t, supervisor.Awake, nil)
	first := r.granted(r.admit(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	waiting := r.admit(ctx)
	r.until("one queued", func(s Snapshot) bool { return s.QueueDepth == 1 })
	cancel()
	if _, err := waiting.result(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("withdrawn admission: %v", err)
	}
	r.until("queue empty", func(s Snapshot) bool { return s.QueueDepth == 0 })
	first.Done(gateway.Outcome{})
	r.until("idle", func(s Snapshot) bool { return s.Active == 0 })
	if ev, _ := r.m.d.Tracker.Evidence("m"); ev.Active != 0 {
		t.Errorf("leases live after both ended: %d", ev.Active)
	}
}

// Requests that arrive at a sleeping model start one wake between them;
// when it is verified, they are granted in arrival order up to
// max_concurrency, each told how long it waited by the model's clock.
func TestWakeSingleFlight(t *testing.T) {
	r := newRig(t, supervisor.Stopped, func(c *config.Model) { c.MaxConcurrency = 2; c.Queue = 1 })
	r.expect(lifecycle.Sleeping)
	ctx := context.Background()
	var waiting []*admission
	for range 3 {
		waiting = append(waiting, r.admit(ctx))
	}
	wake := r.next("wake")
	r.until("three waiting for the wake", func(s Snapshot) bool { return s.QueueDepth == 3 })
	r.noCall() // one wake for all three
	r.expect(lifecycle.Waking)
	r.clock.Advance(1500 * time.Millisecond)
	wake.reply <- nil
	r.waitEvent(control.EventWake, "")
	ended := make(chan *admission, len(waiting))
	for _, a := range waiting {
		go func() { <-a.done; ended <- a }()
	}
	var tickets []*gateway.Ticket
	for range 2 {
		var a *admission
		select {
		case a = <-ended:
		case <-time.After(within):
			t.Fatal("fewer than two requests granted after the wake")
		}
		tk := r.granted(a)
		if tk.WakeWait != 1500*time.Millisecond {
			t.Errorf("wake wait %v, want 1.5s (the hand-advanced clock)", tk.WakeWait)
		}
		tickets = append(tickets, tk)
	}
	r.until("one left queued", func(s Snapshot) bool { return s.QueueDepth == 1 })
	var last *admission
	for _, a := range waiting {
		if a.pending() {
			last = a
		}
	}
	if last == nil {
		t.Fatal("a third request was granted over max_concurrency 2")
	}
	tickets[0].Done(gateway.Outcome{})
	tickets = append(tickets[1:], r.granted(last))
	for _, tk := range tickets {
		tk.Done(gateway.Outcome{})
	}
	r.expect(lifecycle.Awake)
	if lw := r.m.Snapshot().Lifecycle.LastWake; lw != 1500*time.Millisecond {
		t.Errorf("last wake %v, want 1.5s", lw)
	}
}

// A wake past wake_timeout (by the model's clock, at a tick) is given up:
// its call is cancelled, the attempt counts, and the request still waiting
// starts the next attempt, which serves it.
func TestWakeTimeoutRetries(t *testing.T) {
	r := newRig(t, supervisor.Stopped, nil)
	a := r.admit(context.Background())
	first := r.next("wake")
	r.clock.Advance(r.cfg.WakeTimeout)
	r.m.Tick()
	select {
	case <-first.ctx.Done():
	case <-time.After(within):
		t.Fatal("the abandoned wake's call was not cancelled")
	}
	r.next("sleep").reply <- nil // the failed attempt's engine is stopped
	second := r.next("wake")
	r.sync()
	if st := r.m.Snapshot().Lifecycle; st.State != lifecycle.Waking || st.Attempts != 1 {
		t.Fatalf("after the timeout: %+v, want waking with 1 attempt spent", st)
	}
	second.reply <- nil
	r.granted(a).Done(gateway.Outcome{})
}

// An operator sleep of a model serving a request drains: the sleep call
// is issued only when the request ends, and the operator learns the
// outcome from that call.
func TestDrainThenSleep(t *testing.T) {
	r := newRig(t, supervisor.Awake, nil)
	tk := r.granted(r.admit(context.Background()))
	slept := r.operatorSleep()
	r.waitEvent(control.EventState, "draining")
	r.noCall() // the request still runs
	tk.Done(gateway.Outcome{})
	c := r.next("sleep")
	if c.strategy != sleepmode.Stop || c.spec.Port != 8001 {
		t.Errorf("sleep call %q on port %d", c.strategy, c.spec.Port)
	}
	if f := r.m.Snapshot().Freed; !f.IsZero() {
		t.Errorf("freed at %v before the engine slept", f)
	}
	r.clock.Advance(time.Second)
	c.reply <- nil
	if err := <-slept; err != nil {
		t.Fatalf("operator sleep: %v", err)
	}
	r.expect(lifecycle.Sleeping)
	// The make-room desk reads this to know a GPU reading may still show
	// the engine's memory.
	if f := r.m.Snapshot().Freed; !f.Equal(r.clock.Now()) {
		t.Errorf("freed at %v, want the sleep's end %v", f, r.clock.Now())
	}
}

// A request that arrives during a drain cancels it (arrival_while_draining
// = "cancel-drain"): it is served, the model stays awake, and the operator
// sleep waiting for the drain is told why it did not happen.
func TestCancelDrain(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.MaxConcurrency = 2 })
	tk := r.granted(r.admit(context.Background()))
	slept := r.operatorSleep()
	r.waitEvent(control.EventState, "draining")
	late := r.granted(r.admit(context.Background()))
	err := <-slept
	if err == nil || !strings.Contains(err.Error(), "drain cancelled") {
		t.Fatalf("operator sleep: %v, want the cancelled drain", err)
	}
	tk.Done(gateway.Outcome{})
	late.Done(gateway.Outcome{})
	r.expect(lifecycle.Awake)
	r.noCall()
}

// A drain that outlasts drain_timeout (by the model's clock) is abandoned
// at the next tick; the operator's sleep fails with the reason.
func TestDrainAbandoned(t *testing.T) {
	r := newRig(t, supervisor.Awake, nil)
	tk := r.granted(r.admit(context.Background()))
	slept := r.operatorSleep()
	r.waitEvent(control.EventState, "draining")
	r.clock.Advance(r.cfg.DrainTimeout)
	r.m.Tick()
	if err := <-slept; err == nil || !strings.Contains(err.Error(), "drain abandoned") {
		t.Fatalf("operator sleep: %v, want the abandoned drain", err)
	}
	tk.Done(gateway.Outcome{})
	r.expect(lifecycle.Awake)
	r.noCall()
}

// A sleep call that fails is the operator's error, and leaves the model
// unverified.
func TestOperatorSleepFails(t *testing.T) {
	r := newRig(t, supervisor.Awake, nil)
	slept := r.operatorSleep()
	r.next("sleep").reply <- errors.New("engine did not stop")
	if err := <-slept; err == nil || !strings.Contains(err.Error(), "engine did not stop") {
		t.Fatalf("operator sleep: %v", err)
	}
	r.expect(lifecycle.Unverified)
	if err := r.m.Sleep(context.Background(), sleepmode.None); err == nil {
		t.Error(`strategy "none" accepted`)
	}
}

// An engine that exits while it serves a request makes the model wake
// again for that request's lease (demand waits); a new request queues for
// that wake. A notice about an engine from before the wake is ignored.
func TestEngineExitDuringRequests(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.MaxConcurrency = 2 })
	inFlight := r.granted(r.admit(context.Background()))
	before := r.clock.Now()
	r.clock.Advance(time.Second)
	r.m.EngineExited("exit status 1", r.clock.Now())
	wake := r.next("wake")
	r.expect(lifecycle.Waking)
	if f := r.m.Snapshot().Freed; !f.Equal(r.clock.Now()) {
		t.Errorf("freed at %v, want the exit %v", f, r.clock.Now())
	}
	next := r.admit(context.Background())
	r.until("queued for the wake", func(s Snapshot) bool { return s.QueueDepth == 1 })
	r.m.EngineExited("old instance", before) // dated before the wake: old news
	if st := r.state(); st != lifecycle.Waking {
		t.Fatalf("a stale exit changed the state to %v", st)
	}
	wake.reply <- nil
	r.granted(next).Done(gateway.Outcome{})
	inFlight.Done(gateway.Outcome{})
	r.expect(lifecycle.Awake)
}

// A reload that changes the engine restarts it once the model is idle: the
// request in flight keeps the old engine, then the old engine is put to
// sleep (stop) and stopped, and the next request wakes the new one and is
// sent to its port.
func TestReloadChangedEngine(t *testing.T) {
	r := newRig(t, supervisor.Awake, nil)
	old := r.granted(r.admit(context.Background()))
	cfg := testConfig("m")
	r.m.Reconfigure(cfg, specFor(cfg, 8002))
	r.noCall() // a request holds the old engine
	old.Done(gateway.Outcome{})
	c := r.next("sleep")
	if c.spec.Port != 8001 || c.strategy != sleepmode.Stop {
		t.Fatalf("drained sleep of %d by %q, want the old engine (8001) by stop", c.spec.Port, c.strategy)
	}
	c.reply <- nil
	c = r.next("sleep")
	if c.spec.Port != 8001 {
		t.Fatalf("stop of port %d, want the old engine's 8001", c.spec.Port)
	}
	c.reply <- nil
	r.until("restart done", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Sleeping && s.Spec.Port == 8002 })
	a := r.admit(context.Background())
	w := r.next("wake")
	if w.spec.Port != 8002 {
		t.Fatalf("wake of port %d, want the new engine's 8002", w.spec.Port)
	}
	w.reply <- nil
	tk := r.granted(a)
	if tk.Target.Host != "127.0.0.1:8002" {
		t.Errorf("request sent to %v, want the new engine", tk.Target)
	}
	tk.Done(gateway.Outcome{})
}

// A model removed by a reload refuses its queue, stops its engine once its
// last lease ends, and its loop ends.
func TestRetire(t *testing.T) {
	r := newRig(t, supervisor.Awake, nil)
	tk := r.granted(r.admit(context.Background()))
	queued := r.admit(context.Background())
	r.until("one queued", func(s Snapshot) bool { return s.QueueDepth == 1 })
	r.m.Retire()
	var ref *gateway.Refusal
	if _, err := queued.result(t); !errors.As(err, &ref) || ref.Code != "model_removed" {
		t.Fatalf("queued request of a removed model: %v", err)
	}
	r.noCall()
	tk.Done(gateway.Outcome{})
	r.next("sleep").reply <- nil // the drained sleep (stop)
	r.next("sleep").reply <- nil // the stop
	select {
	case <-r.m.Done():
	case <-time.After(within):
		t.Fatal("the removed model's loop did not end")
	}
	if _, err := r.m.Admit(context.Background(), lease.Request{Model: "m"}); !errors.As(err, &ref) || ref.Code != "model_removed" {
		t.Errorf("admission after removal: %v", err)
	}
}

// admitAs is an admission for client.
func (r *rig) admitAs(ctx context.Context, client string) *admission {
	a := &admission{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.ticket, a.err = r.m.Admit(ctx, lease.Request{Model: "m", Client: client, Kind: request.Chat})
	}()
	return a
}

// fairOrder queues requests from clients (in that arrival order) behind
// one slot held by alice, and returns the order in which the queue is
// granted as the slot frees one request at a time.
func fairOrder(t *testing.T, fair bool, clients ...string) []string {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Queue = 10; c.FairShare = fair })
	r.expect(lifecycle.Awake)
	held := r.granted(r.admitAs(context.Background(), "alice"))
	reqs := map[string]lease.Request{}
	for _, c := range clients {
		reqs[c] = lease.Request{Client: c}
	}
	order, _ := r.grantOrder(held, r.queue(reqs, clients...))
	return order
}

// With fair_share, a burst from one client does not keep the others
// waiting behind it: the queue is admitted round-robin by client name,
// starting after the client served last; without it, by arrival.
func TestAdmissionFairShare(t *testing.T) {
	burst := []string{"alice", "alice", "alice", "alice", "alice", "carol", "bob"}
	if got := strings.Join(fairOrder(t, true, burst...), " "); got != "bob carol alice alice alice alice alice" {
		t.Errorf("fair share, one burst: %q", got)
	}
	if got := strings.Join(fairOrder(t, false, burst...), " "); got != "alice alice alice alice alice carol bob" {
		t.Errorf("arrival order: %q", got)
	}
	two := []string{"alice", "alice", "alice", "bob", "bob", "bob", "carol"}
	if got := strings.Join(fairOrder(t, true, two...), " "); got != "bob carol alice bob alice bob alice" {
		t.Errorf("fair share, two bursts: %q", got)
	}
}

// yieldWithOneQueued has an awake model yield (a Demand sleep) with one
// request in flight, and another arrive during the yield.
func (r *rig) yieldWithOneQueued() (inFlight *gateway.Ticket, late *admission) {
	r.t.Helper()
	inFlight = r.granted(r.admit(context.Background()))
	r.m.RequestSleep(lifecycle.SleepRequest{Reason: lifecycle.Demand, Cause: "yield"}, lifecycle.Evidence{Engine: lifecycle.EngineBusy})
	r.until("yielding", func(s Snapshot) bool { return s.Lifecycle.Yielding })
	late = r.admit(context.Background())
	r.until("one queued", func(s Snapshot) bool { return s.QueueDepth == 1 })
	return inFlight, late
}

// A busy holder yields (a Demand sleep): requests arriving meanwhile are
// queued, not refused nor admitted; the sleep is issued once the request in
// flight ends, although the queued one holds a lease; then the queued one
// wakes the model again and is served.
func TestYieldQueuesArrivalsAndDrainsTheRequestInFlight(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Queue = 4 })
	inFlight, late := r.yieldWithOneQueued()
	if !late.pending() {
		t.Fatal("a request arriving during the yield was answered before the sleep")
	}
	r.noCall() // the request in flight is not cut
	r.clock.Advance(2 * time.Second)
	inFlight.Done(gateway.Outcome{})
	sl := r.next("sleep")
	r.sync()
	if got := r.m.Snapshot().Learned.Request; got != 2*time.Second {
		t.Errorf("learned request time %s, want 2s", got)
	}
	sl.reply <- nil
	w := r.next("wake") // the queued request wakes the model again
	w.reply <- nil
	r.granted(late).Done(gateway.Outcome{})
	r.expect(lifecycle.Awake)
}

// A yield nobody needs any more is cancelled: the queued request is served
// by the engine still running, and nothing sleeps.
func TestCancelYieldServesTheQueue(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Queue = 4 })
	inFlight, late := r.yieldWithOneQueued()
	r.m.CancelYield()
	r.expect(lifecycle.Awake)
	inFlight.Done(gateway.Outcome{})
	r.granted(late).Done(gateway.Outcome{})
	r.noCall()
}

// ${GPUS} is filled in at each wake with the GPUs chosen for it, and "$${"
// becomes "${" then: the engine is started with the final command line.
func TestWakeExpandsGPUs(t *testing.T) {
	gpus := make(chan []int, 2)
	gpus <- []int{1, 3}
	gpus <- []int{0}
	r := newRigWith(t, supervisor.Stopped, func(c *config.Model) {
		c.GPUCount = 2
		c.Command = []string{"engine", "--devices=${GPUS}", "$${HOME}"}
		c.Environment = map[string]string{"DEV": "${GPUS}"}
	}, func(d *Deps) {
		d.MakeRoom = func(context.Context, string, func(string)) ([]int, error) { return <-gpus, nil }
		// The reading knows GPU 0 as ROCm's agent 2; not GPUs 1 and 3.
		d.GPUDevices = func(g []int) []supervisor.GPU {
			if slices.Equal(g, []int{0}) {
				return []supervisor.GPU{{Vendor: "amd", ID: "2", Node: "/dev/dri/renderD130"}}
			}
			return nil
		}
	})
	r.expect(lifecycle.Sleeping)
	for _, want := range []string{"1,3", "0"} {
		a := r.admit(context.Background())
		wake := r.next("wake")
		if got := wake.spec.Command; !slices.Equal(got, []string{"engine", "--devices=" + want, "${HOME}"}) || wake.spec.Environment["DEV"] != want {
			t.Errorf("wake started %q with %v, want --devices=%s", got, wake.spec.Environment, want)
		}
		if env := wake.spec.VisibleDevices(); want == "0" && env["ROCR_VISIBLE_DEVICES"] != "2" || want != "0" && env["CUDA_VISIBLE_DEVICES"] != want {
			t.Errorf("wake on %s started with %v", want, env)
		}
		wake.reply <- nil
		r.granted(a).Done(gateway.Outcome{})
		slept := r.operatorSleep()
		r.next("sleep").reply <- nil
		if err := <-slept; err != nil {
			t.Fatal(err)
		}
	}
	if s := r.m.Snapshot().Spec; s.Command[1] != "--devices=${GPUS}" {
		t.Errorf("the model's spec changed: %q", s.Command)
	}
}

// A wake waiting for GPU memory says for whom in its state's reason; a
// request whose deadline runs out meanwhile gets 504 naming the holders;
// when its requests have left, the wake is given up without an attempt.
func TestRoomWaitEndsIn504NamingTheHolders(t *testing.T) {
	left := make(chan struct{})
	r := newRigWith(t, supervisor.Stopped, nil, func(d *Deps) {
		d.MakeRoom = func(ctx context.Context, _ string, waiting func(string)) ([]int, error) {
			waiting("busy a (16.0 GiB)")
			select {
			case <-left:
				return nil, errors.New("its requests left while it waited for GPU memory")
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		d.WaitingFor = func(string) string { return "busy a (16.0 GiB)" }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	a := r.admit(ctx)
	r.until("waiting for room", func(s Snapshot) bool { return s.Lifecycle.RoomWait })
	if reason := r.m.Snapshot().Lifecycle.Reason; !strings.Contains(reason, "held by busy a") {
		t.Errorf("reason %q", reason)
	}
	_, err := a.result(t)
	var ref *gateway.Refusal
	if !errors.As(err, &ref) || ref.Status != http.StatusGatewayTimeout ||
		!strings.Contains(ref.Message, "waiting for GPU memory held by busy a (16.0 GiB)") {
		t.Fatalf("admission: %v, want 504 naming a", err)
	}
	close(left)
	r.until("asleep again", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Sleeping })
	if s := r.m.Snapshot().Lifecycle; s.Attempts != 0 {
		t.Errorf("a room wait spent %d wake attempts", s.Attempts)
	}
	r.noCall()
}

// nextProbe ticks the loop until it sends a health probe (the result of
// the previous one may still be on its way to the loop), and returns
// where to answer it. A probe sent proves the previous result handled.
func (r *rig) nextProbe() chan<- ProbeResult {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		r.m.Tick()
		r.sync()
		select {
		case reply := <-r.probes:
			return reply
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatal("no health probe")
		}
	}
}

// probe answers the next health probe with res.
func (r *rig) probe(res ProbeResult) {
	r.t.Helper()
	r.nextProbe() <- res
}

// sent is a reading of progress: the engine sent n bytes on one connection.
func sent(n uint64) Progress {
	c := sockets.Conn{Local: netip.MustParseAddrPort("127.0.0.1:8001"), Remote: netip.MustParseAddrPort("127.0.0.1:50000")}
	return Progress{Sent: map[sockets.Conn]uint64{c: n}}
}

// An awake engine is probed every health_interval; failures count only
// without progress, and health_failures of them make the model
// unverified. The next request stops the hung engine first, and its exit
// does not fail the wake that replaces it.
func TestHealthWatch(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.HealthInterval, c.HealthFailures = 10*time.Second, 2 })
	r.expect(lifecycle.Awake)
	r.m.Tick() // starts watching the engine
	r.m.Tick()
	r.sync()
	select {
	case <-r.probes:
		t.Fatal("probed before health_interval passed")
	default:
	}
	hung := errors.New("GET /health: context deadline exceeded")
	step := func(res ProbeResult) {
		r.clock.Advance(10 * time.Second)
		r.probe(res)
	}
	// Only a serving model is probed: each probe below proves the earlier
	// results left it awake.
	step(ProbeResult{Progress: sent(100)})            // healthy
	step(ProbeResult{Err: hung, Progress: sent(900)}) // busy streaming: no answer, but it sends
	step(ProbeResult{Err: hung, Progress: sent(5000)})
	step(ProbeResult{Err: hung, Progress: sent(5000)}) // stalled: 1 of 2
	step(ProbeResult{Err: hung, Progress: sent(5000)}) // 2 of 2
	r.until("unverified", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Unverified })
	if lc := r.m.Snapshot().Lifecycle; lc.Attempts != 1 || !strings.Contains(lc.Reason, "2 health probes failed with no progress") {
		t.Fatalf("after the hang: %+v", lc)
	}
	r.m.Tick() // not serving: no probe
	r.noCall()

	a := r.admit(context.Background())
	stop := r.next("sleep") // the hung engine is stopped first
	if stop.strategy != sleepmode.Stop {
		t.Fatalf("stale engine stopped with %q", stop.strategy)
	}
	r.m.EngineExited("exit status 0", r.clock.Now()) // that stop's exit
	stop.reply <- nil
	wake := r.next("wake")
	r.sync()
	if st := r.m.Snapshot().Lifecycle; st.State != lifecycle.Waking || st.Attempts != 1 {
		t.Fatalf("the stop's exit failed the wake: %+v", st)
	}
	wake.reply <- nil
	tk, err := a.result(t)
	if err != nil {
		t.Fatal(err)
	}
	tk.Done(gateway.Outcome{})
	r.expect(lifecycle.Awake)
}

// Where progress cannot be seen (no counters, no netlink), failed probes
// do not count while requests are in flight: they may be a long
// generation. Once they ended, the engine can be found hung.
func TestHealthWatch_UnknownProgressWaitsForRequests(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.HealthInterval, c.HealthFailures = 10*time.Second, 1 })
	r.expect(lifecycle.Awake)
	r.m.Tick() // starts watching
	tk := r.granted(r.admit(context.Background()))
	hung := errors.New("GET /health: context deadline exceeded")
	for range 3 {
		r.clock.Advance(10 * time.Second)
		r.probe(ProbeResult{Err: hung})
	}
	r.clock.Advance(10 * time.Second)
	reply := r.nextProbe() // the three failures left it awake
	r.expect(lifecycle.Awake)
	tk.Done(gateway.Outcome{})
	reply <- ProbeResult{Err: hung} // nothing in flight now: it counts
	r.until("unverified", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Unverified })
}

// Every 503 of the loop takes its Retry-After from what the loop learned
// (requests of 6 s and a wake of 8 s by the hand-advanced clock), never
// from a constant: a full queue, a refusing drain, a removed model.
func TestRetryAfterLearned(t *testing.T) {
	const request, wake = 6 * time.Second, 8 * time.Second
	r := newRig(t, supervisor.Awake, func(c *config.Model) {
		c.MaxConcurrency, c.Queue = 2, 3
		c.ArrivalWhileDraining = lifecycle.ArrivalRefuse
	})
	r.expect(lifecycle.Awake)
	ctx := context.Background()
	// fill admits n requests one after another, so they queue in order.
	fill := func(n int) []*admission {
		var as []*admission
		for i := range n {
			as = append(as, r.admit(ctx))
			r.until("admitted or queued", func(s Snapshot) bool { return s.Active+s.QueueDepth == i+1 })
		}
		return as
	}
	// serve serves as in order, two at a time, each for request.
	serve := func(as []*admission) {
		run := []*gateway.Ticket{r.granted(as[0]), r.granted(as[1])}
		rest := as[2:]
		for len(run) > 0 {
			r.clock.Advance(request)
			var next []*gateway.Ticket
			for _, tk := range run {
				tk.Done(gateway.Outcome{})
				if len(rest) > 0 {
					next, rest = append(next, r.granted(rest[0])), rest[1:]
				}
			}
			run = next
		}
		r.until("all served", func(s Snapshot) bool { return s.Active+s.QueueDepth == 0 })
	}
	refused := func(a *admission, code string, want time.Duration) {
		t.Helper()
		_, err := a.result(t)
		var ref *gateway.Refusal
		if !errors.As(err, &ref) || ref.Code != code || ref.RetryAfter != want {
			t.Fatalf("admission: %v (%+v), want %s with Retry-After %v", err, ref, code, want)
		}
	}

	// Nothing measured yet: the least hint.
	as := fill(5)
	refused(r.admit(ctx), "queue_full", lifecycle.MinRetryAfter)
	serve(as)
	// Three queued ahead and itself, less no free slot, two at a time:
	// two typical requests.
	as = fill(5)
	refused(r.admit(ctx), "queue_full", 2*request)
	serve(as)

	// A refusing drain ends with the request in flight: a typical one.
	tk := r.granted(r.admit(ctx))
	slept := r.operatorSleep()
	r.waitEvent(control.EventState, "draining")
	refused(r.admit(ctx), "model_draining", request)
	tk.Done(gateway.Outcome{})
	r.next("sleep").reply <- nil
	if err := <-slept; err != nil {
		t.Fatalf("operator sleep: %v", err)
	}

	// Learn a wake, then sleep again.
	a := r.admit(ctx)
	c := r.next("wake")
	r.clock.Advance(wake)
	c.reply <- nil
	tk = r.granted(a)
	r.clock.Advance(request)
	tk.Done(gateway.Outcome{})
	slept = r.operatorSleep()
	r.next("sleep").reply <- nil
	if err := <-slept; err != nil {
		t.Fatalf("operator sleep: %v", err)
	}
	// Five wait for a wake under way for 3 s: the rest of a typical wake,
	// then the three beyond the two slots it opens and itself, two at a
	// time.
	as = fill(5)
	c = r.next("wake")
	r.clock.Advance(3 * time.Second)
	refused(r.admit(ctx), "queue_full", wake-3*time.Second+2*request)

	// A removed model is gone once its requests in flight end.
	c.reply <- nil
	r.granted(as[0])
	r.granted(as[1])
	r.m.Retire()
	refused(as[2], "model_removed", request)
}

// The sleep ladder: a model asleep with vllm-l1 is put to sleep again with
// stop (the state stays Sleeping, Slept records the level); a request
// arriving meanwhile waits for that stop and then wakes the engine, and
// Deepen does nothing to an awake model or one already at that level.
func TestDeepenRecordsTheLevelAndWakesAfterIt(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Sleep = sleepmode.VLLML1 })
	slept := r.operatorSleep()
	if c := r.next("sleep"); c.strategy != sleepmode.VLLML1 {
		t.Fatalf("sleep strategy %q", c.strategy)
	} else {
		c.reply <- nil
	}
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	r.until("asleep with vllm-l1", func(s Snapshot) bool { return s.Slept == sleepmode.VLLML1 })
	r.m.Deepen(sleepmode.Stop, "deep-sleep")
	deeper := r.next("sleep")
	if deeper.strategy != sleepmode.Stop {
		t.Fatalf("deeper strategy %q", deeper.strategy)
	}
	r.m.Deepen(sleepmode.Stop, "deep-sleep") // one in flight: no second call
	a := r.admit(context.Background())
	r.until("waking", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Waking })
	r.noCall() // the wake waits for the stop (opMu)
	deeper.reply <- nil
	r.next("wake").reply <- nil
	r.granted(a).Done(gateway.Outcome{})
	r.expect(lifecycle.Awake)
	r.until("awake: no level", func(s Snapshot) bool { return s.Slept == "" })
	r.m.Deepen(sleepmode.Stop, "deep-sleep") // awake: nothing to do
	r.noCall()
}
