package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/request"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const model = "qwen"

var policy = lifecycle.Policy{
	DrainTimeout:         30 * time.Second,
	WakeTimeout:          10 * time.Minute,
	WakeAttempts:         3,
	ArrivalWhileDraining: lifecycle.ArrivalCancelDrain,
	IdleMinimum:          time.Minute,
}

// box is the owner loop in miniature: a hand-advanced clock, a tracker and
// one model's machine, with the helpers a test needs to speak for the
// gateway, the planner and the supervisor.
type box struct {
	t   *testing.T
	now time.Time
	tr  *lease.Tracker
	m   *lifecycle.Machine
}

func newBox(t *testing.T, p lifecycle.Policy, r lifecycle.Report) *box {
	t.Helper()
	b := &box{t: t, now: t0, tr: lease.NewTracker(lease.Options{})}
	b.tr.Register(model, t0)
	b.m = lifecycle.New(t0, p)
	b.m.Reconcile(t0, r)
	return b
}

func (b *box) advance(d time.Duration) { b.now = b.now.Add(d) }

func (b *box) ev() lease.Evidence {
	e, ok := b.tr.Evidence(model)
	if !ok {
		b.t.Fatal("model not registered")
	}
	return e
}

// arrive begins a lease and announces it, as the agent's Admit does.
func (b *box) arrive(r lease.Request) (lease.ID, lifecycle.Decision) {
	b.t.Helper()
	r.Model = model
	a, err := b.tr.Begin(b.now, r)
	if err != nil || a.Verdict != lease.Started {
		b.t.Fatalf("Begin = %+v, %v; want started", a, err)
	}
	return a.ID, b.m.Arrive(b.now)
}

// finish ends a lease and, when it was the last, tells the machine.
func (b *box) finish(id lease.ID, out lease.Outcome) lifecycle.Decision {
	b.t.Helper()
	e, ok := b.tr.End(b.now, id, out)
	if !ok {
		b.t.Fatalf("End(%d): not live", id)
	}
	if e.Idle {
		return b.m.LastLeaseEnded(b.now, b.ev())
	}
	return lifecycle.Decision{}
}

func (b *box) sleep(reason lifecycle.SleepReason, engine lifecycle.EngineActivity) lifecycle.Decision {
	return b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: reason, Strategy: "stop"},
		lifecycle.Evidence{Leases: b.ev(), Engine: engine})
}

func (b *box) wakeDone(op lifecycle.Op, err error) lifecycle.Decision {
	return b.m.WakeDone(b.now, op, err, b.ev())
}

func (b *box) sleepDone(op lifecycle.Op, err error) lifecycle.Decision {
	return b.m.SleepDone(b.now, op, err, b.ev())
}

func (b *box) tick() lifecycle.Decision { return b.m.Tick(b.now, b.ev()) }

func (b *box) wantState(s lifecycle.State) lifecycle.Snapshot {
	b.t.Helper()
	snap := b.m.Snapshot()
	if snap.State != s {
		b.t.Fatalf("state = %v (%s), want %v", snap.State, snap.Reason, s)
	}
	return snap
}

func want(t *testing.T, d lifecycle.Decision, a lifecycle.Action) lifecycle.Decision {
	t.Helper()
	if d.Action != a {
		t.Fatalf("decision = %v (%s), want %v", d.Action, d.Reason, a)
	}
	return d
}

var errUnhealthy = errors.New("health check failed: connection refused")

func TestMachine_BusyRejection(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	b.advance(time.Hour)
	for _, r := range []lifecycle.SleepReason{lifecycle.IdleTimeout, lifecycle.MemoryPressure, lifecycle.Operator} {
		d := want(t, b.sleep(r, lifecycle.EngineBusy), lifecycle.Declined)
		if !strings.Contains(d.Reason, "engine reports") {
			t.Fatalf("%v: reason %q does not name the engine's evidence", r, d.Reason)
		}
	}
	// A live lease declines any automatic sleep, however quiet the engine.
	id, _ := b.arrive(lease.Request{Kind: request.Chat})
	d := want(t, b.sleep(lifecycle.MemoryPressure, lifecycle.EngineIdle), lifecycle.Declined)
	if d.Reason != "1 requests in flight" {
		t.Fatalf("reason = %q", d.Reason)
	}
	b.wantState(lifecycle.Awake)
	b.finish(id, lease.Outcome{})
}

func TestMachine_IdleMinimum(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	want(t, d, lifecycle.StartWake)
	b.advance(20 * time.Second)
	want(t, b.wakeDone(d.Op, nil), lifecycle.AdmitWaiting)
	b.advance(time.Second)
	b.finish(id, lease.Outcome{})

	b.advance(59 * time.Second)
	d = want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.Declined)
	if !strings.Contains(d.Reason, "idle minimum") {
		t.Fatalf("reason = %q", d.Reason)
	}
	b.advance(time.Second) // a full minute since the lease ended
	d = want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.IssueSleep)
	if d.Sleep.Strategy != "stop" || d.Sleep.Reason != lifecycle.IdleTimeout {
		t.Fatalf("sleep = %+v", d.Sleep)
	}

	// The minimum also counts from the wake when the model was woken with
	// nobody using it (an operator wake), and an operator sleep skips it.
	b = newBox(t, policy, lifecycle.ReportAsleep)
	b.advance(time.Hour)
	d = want(t, b.m.Arrive(b.now), lifecycle.StartWake)
	want(t, b.wakeDone(d.Op, nil), lifecycle.AdmitWaiting)
	b.advance(30 * time.Second)
	want(t, b.sleep(lifecycle.MemoryPressure, lifecycle.EngineIdle), lifecycle.Declined)
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.IssueSleep)
}

func TestMachine_ArrivalDuringDrainCancelsDrain(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	stream, _ := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.None)
	b.wantState(lifecycle.Draining)

	b.advance(time.Second)
	late, d := b.arrive(lease.Request{Kind: request.Chat})
	want(t, d, lifecycle.Admit)
	b.wantState(lifecycle.Awake)
	b.finish(stream, lease.Outcome{})
	if d := b.finish(late, lease.Outcome{}); d.Action != lifecycle.None {
		t.Fatalf("cancelled drain still issued %v", d.Action)
	}
	b.wantState(lifecycle.Awake)
}

func TestMachine_ArrivalDuringDrainRefused(t *testing.T) {
	p := policy
	p.ArrivalWhileDraining = lifecycle.ArrivalRefuse
	b := newBox(t, p, lifecycle.ReportServing)
	stream, _ := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.None)

	late, d := b.arrive(lease.Request{Kind: request.Chat})
	want(t, d, lifecycle.Refuse)
	// Nothing learned yet: the drain may last until drain_timeout.
	if r := d.Refusal; r.Status != 503 || r.RetryAfter != policy.DrainTimeout || r.Code != lifecycle.CodeModelDraining {
		t.Fatalf("refusal = %+v", r)
	}
	if d := b.finish(late, lease.Outcome{Cancelled: true}); d.Action != lifecycle.None {
		t.Fatalf("refused lease end: %v with the stream still live", d.Action)
	}
	d = want(t, b.finish(stream, lease.Outcome{}), lifecycle.IssueSleep)
	// Once the sleep call is in flight the refuse policy still refuses.
	late, d2 := b.arrive(lease.Request{})
	want(t, d2, lifecycle.Refuse)
	b.finish(late, lease.Outcome{Cancelled: true})
	want(t, b.sleepDone(d.Op, nil), lifecycle.None)
	b.wantState(lifecycle.Sleeping)
}

func TestMachine_DrainTimeoutAbandons(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	id, _ := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.None)
	b.advance(29 * time.Second)
	want(t, b.tick(), lifecycle.None)
	b.advance(time.Second)
	d := want(t, b.tick(), lifecycle.AbandonDrain)
	if !strings.Contains(d.Reason, "drain abandoned after 30s") {
		t.Fatalf("reason = %q", d.Reason)
	}
	b.wantState(lifecycle.Awake)
	if d := b.finish(id, lease.Outcome{}); d.Action != lifecycle.None {
		t.Fatalf("abandoned drain still issued %v", d.Action)
	}
}

// A stream outliving the idle timeout keeps the model awake; idleness counts
// from its last byte, not its start.
func TestMachine_LongStreamOutlivesIdleTimeout(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	b.advance(time.Hour)
	id, d := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	want(t, d, lifecycle.Admit)
	b.advance(45 * time.Minute) // 3x a 15m idle timeout
	want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.Declined)
	b.finish(id, lease.Outcome{})
	endedAt := b.now
	b.advance(30 * time.Second)
	want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.Declined)
	if got := b.ev(); !got.Since.Equal(endedAt) {
		t.Fatalf("idle since %v, want the stream's end %v", got.Since, endedAt)
	}
	b.advance(30 * time.Second)
	want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.IssueSleep)
}

// A client that disconnects mid-stream releases its lease: the model
// becomes idle at once and its retry runs afresh.
func TestMachine_MidStreamDisconnect(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	req := lease.Request{Client: "alice", Kind: request.Chat, Stream: true, IdempotencyKey: "k"}
	id, _ := b.arrive(req)
	b.advance(10 * time.Second)
	b.finish(id, lease.Outcome{Cancelled: true})
	if e := b.ev(); !e.Idle() || !e.Since.Equal(b.now) {
		t.Fatalf("after disconnect: %+v", e)
	}
	b.advance(time.Second)
	retry, d := b.arrive(req) // would fail the test unless Started
	want(t, d, lifecycle.Admit)
	b.finish(retry, lease.Outcome{})
}

// Requests that arrive while asleep all queue behind one wake and keep the
// model Active; nothing may put it to sleep meanwhile.
func TestMachine_QueuedWork(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	first, d := b.arrive(lease.Request{Kind: request.Chat})
	wake := want(t, d, lifecycle.StartWake)
	if wake.Attempt != 1 {
		t.Fatalf("attempt = %d", wake.Attempt)
	}
	var ids []lease.ID
	for range 3 {
		id, d := b.arrive(lease.Request{Kind: request.Embedding})
		want(t, d, lifecycle.QueueForWake)
		ids = append(ids, id)
	}
	if e := b.ev(); e.Active != 4 {
		t.Fatalf("queued evidence = %+v, want 4 active", e)
	}
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.Declined)
	b.advance(40 * time.Second)
	want(t, b.wakeDone(wake.Op, nil), lifecycle.AdmitWaiting)
	if snap := b.wantState(lifecycle.Awake); snap.LastWake != 40*time.Second {
		t.Fatalf("last wake = %v", snap.LastWake)
	}
	for _, id := range append(ids, first) {
		b.finish(id, lease.Outcome{})
	}
	if e := b.ev(); !e.Idle() {
		t.Fatalf("after all: %+v", e)
	}
}

// Retries with an idempotency key: a join while the first is queued for a
// wake is counted once and never announced to the machine; after the first
// finishes the retry replays.
func TestMachine_JoinedAndReplayedRetries(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	req := lease.Request{Model: model, Client: "alice", Kind: request.Chat, IdempotencyKey: "k"}
	id, d := b.arrive(req)
	wake := want(t, d, lifecycle.StartWake)
	j, err := b.tr.Begin(b.now, req)
	if err != nil || j.Verdict != lease.Joined || j.ID != id {
		t.Fatalf("retry during wake = %+v, %v", j, err)
	}
	if e := b.ev(); e.Active != 1 {
		t.Fatalf("a join was counted: %+v", e)
	}
	want(t, b.wakeDone(wake.Op, nil), lifecycle.AdmitWaiting)
	want(t, b.finish(id, lease.Outcome{Response: &lease.Stored{Status: 200, Body: []byte("{}")}}), lifecycle.None)
	<-j.Wait
	r, err := b.tr.Begin(b.now, req)
	if err != nil || r.Verdict != lease.Replayed || r.Response.Status != 200 {
		t.Fatalf("retry after finish = %+v, %v", r, err)
	}
}

func TestMachine_DemandDrivenWake(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	b.wantState(lifecycle.Sleeping)
	id, d := b.arrive(lease.Request{Kind: request.Completion})
	wake := want(t, d, lifecycle.StartWake)
	b.wantState(lifecycle.Waking)
	if d := b.wakeDone(wake.Op+1, nil); d.Action != lifecycle.None {
		t.Fatalf("result for another op = %v", d.Action)
	}
	b.wantState(lifecycle.Waking)
	b.advance(12 * time.Second)
	want(t, b.wakeDone(wake.Op, nil), lifecycle.AdmitWaiting)
	if d := b.wakeDone(wake.Op, nil); d.Action != lifecycle.None {
		t.Fatalf("duplicate wake result = %v", d.Action)
	}
	b.wantState(lifecycle.Awake)
	want(t, b.m.Arrive(b.now), lifecycle.Admit)
	b.finish(id, lease.Outcome{})
}

// An unhealthy wake spends an attempt. With nobody waiting the model goes
// back to sleeping (a later demand wakes it); with requests waiting the next
// attempt starts at once.
func TestMachine_UnhealthyWake(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	wake := want(t, d, lifecycle.StartWake)
	b.finish(id, lease.Outcome{Cancelled: true}) // the client gave up
	want(t, b.wakeDone(wake.Op, errUnhealthy), lifecycle.None)
	snap := b.wantState(lifecycle.Sleeping)
	if snap.Attempts != 1 || snap.Reason != "wake attempt 1 of 3 failed: health check failed: connection refused" {
		t.Fatalf("snapshot = %+v", snap)
	}

	id, d = b.arrive(lease.Request{Kind: request.Chat})
	wake = want(t, d, lifecycle.StartWake)
	if wake.Attempt != 2 {
		t.Fatalf("attempt = %d, want 2", wake.Attempt)
	}
	next := want(t, b.wakeDone(wake.Op, errUnhealthy), lifecycle.StartWake)
	if next.Attempt != 3 || next.Op == wake.Op {
		t.Fatalf("next = %+v", next)
	}
	want(t, b.wakeDone(next.Op, nil), lifecycle.AdmitWaiting)
	if snap := b.wantState(lifecycle.Awake); snap.Attempts != 0 {
		t.Fatalf("verified wake kept attempts = %d", snap.Attempts)
	}
	b.finish(id, lease.Outcome{})
}

func TestMachine_ThreeFailedAttempts(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	for attempt := 1; attempt <= 2; attempt++ {
		if d.Attempt != attempt {
			t.Fatalf("attempt = %d, want %d", d.Attempt, attempt)
		}
		d = want(t, b.wakeDone(d.Op, errUnhealthy), lifecycle.StartWake)
		b.wantState(lifecycle.Waking)
	}
	d = want(t, b.wakeDone(d.Op, errUnhealthy), lifecycle.RefuseWaiting)
	const msg = "failed: health check failed: connection refused (3 of 3 attempts)"
	// No wake measured, failed just now: the least hint.
	if r := d.Refusal; r.Message != msg || r.Status != 503 || r.Code != lifecycle.CodeModelFailed || r.RetryAfter != lifecycle.MinRetryAfter {
		t.Fatalf("refusal = %+v", r)
	}
	b.finish(id, lease.Outcome{Cancelled: true})
	snap := b.wantState(lifecycle.Failed)
	if snap.Attempts != 3 || snap.Budget != 3 || snap.Reason != msg {
		t.Fatalf("snapshot = %+v", snap)
	}
	id, d = b.arrive(lease.Request{})
	if want(t, d, lifecycle.Refuse).Refusal.Message != msg {
		t.Fatalf("arrival refusal = %+v", d.Refusal)
	}
	b.finish(id, lease.Outcome{Cancelled: true})
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.Declined)

	b.m.Reset(b.now)
	if snap := b.wantState(lifecycle.Sleeping); snap.Attempts != 0 {
		t.Fatalf("reset kept attempts %d", snap.Attempts)
	}
	d = want(t, b.m.Arrive(b.now), lifecycle.StartWake)
	if d.Attempt != 1 {
		t.Fatalf("attempt after reset = %d", d.Attempt)
	}
	// A config reload clears failed too, and applies the new budget.
	p := policy
	p.WakeAttempts = 1
	b.m.Reload(b.now, p)
	want(t, b.wakeDone(d.Op, errUnhealthy), lifecycle.RefuseWaiting)
	b.wantState(lifecycle.Failed)
	b.m.Reload(b.now, policy)
	b.wantState(lifecycle.Sleeping)
}

func TestMachine_TimedOutWake(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	first := want(t, d, lifecycle.StartWake)
	b.advance(10*time.Minute - time.Nanosecond)
	want(t, b.tick(), lifecycle.None)
	b.advance(time.Nanosecond)
	next := want(t, b.tick(), lifecycle.StartWake) // the request still waits
	if next.Cancel != first.Op {
		t.Fatalf("cancel = %d, want the timed-out attempt %d", next.Cancel, first.Op)
	}
	if !strings.Contains(next.Reason, "wake attempt 1 of 3 failed: timed out after 10m0s") {
		t.Fatalf("reason = %q", next.Reason)
	}
	// The timed-out attempt's late success must not make the model serve.
	if d := b.wakeDone(first.Op, nil); d.Action != lifecycle.None {
		t.Fatalf("late result of the timed-out attempt = %v", d.Action)
	}
	b.wantState(lifecycle.Waking)
	// The caller's own deadline reads as a timeout too.
	b.finish(id, lease.Outcome{Cancelled: true})
	want(t, b.wakeDone(next.Op, fmt.Errorf("wake qwen: %w", context.DeadlineExceeded)), lifecycle.None)
	if snap := b.wantState(lifecycle.Sleeping); snap.Reason != "wake attempt 2 of 3 failed: timed out after 10m0s" {
		t.Fatalf("reason = %q", snap.Reason)
	}
}

// The sleep call's confirmation arrives after napd has moved on: it must
// not put a model that is waking (or awake) back to sleep.
func TestMachine_OutOfOrderSleepConfirmation(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	b.advance(time.Hour)
	sleep := want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.IssueSleep)
	// The caller's sleep call timed out; the engine's state is unknown.
	want(t, b.sleepDone(sleep.Op, context.DeadlineExceeded), lifecycle.None)
	b.wantState(lifecycle.Unverified)
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	wake := want(t, d, lifecycle.StartWake)
	// The first sleep's confirmation arrives late.
	if d := b.sleepDone(sleep.Op, nil); d.Action != lifecycle.None || !strings.Contains(d.Reason, "stale") {
		t.Fatalf("late sleep confirmation = %+v", d)
	}
	b.wantState(lifecycle.Waking)
	want(t, b.wakeDone(wake.Op, nil), lifecycle.AdmitWaiting)
	if d := b.sleepDone(sleep.Op, nil); d.Action != lifecycle.None {
		t.Fatalf("late sleep confirmation while awake = %v", d.Action)
	}
	b.wantState(lifecycle.Awake)
	b.finish(id, lease.Outcome{})

	// A request that arrives while the sleep call is in flight queues; the
	// confirmation then starts the wake for it.
	b.advance(time.Hour)
	sleep = want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.IssueSleep)
	id, d = b.arrive(lease.Request{Kind: request.Chat})
	want(t, d, lifecycle.QueueForWake)
	want(t, b.sleepDone(sleep.Op, nil), lifecycle.StartWake)
	b.finish(id, lease.Outcome{Cancelled: true})
}

func TestMachine_UnprovableIdleness(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	b.advance(time.Hour)
	d := want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineNoEvidence), lifecycle.Declined)
	snap := b.wantState(lifecycle.Unsupported)
	if snap.Reason != d.Reason || !strings.Contains(snap.Reason, "allow_untracked_unload") {
		t.Fatalf("reason = %q / %q", snap.Reason, d.Reason)
	}
	// Unsupported is about unloading only: the model still serves.
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	want(t, d, lifecycle.Admit)
	b.finish(id, lease.Outcome{})
	// Once the engine gives evidence, an automatic sleep may go through.
	b.advance(time.Hour)
	want(t, b.sleep(lifecycle.MemoryPressure, lifecycle.EngineNoEvidence), lifecycle.Declined)
	want(t, b.sleep(lifecycle.MemoryPressure, lifecycle.EngineIdle), lifecycle.IssueSleep)

	// An operator sleep takes the responsibility itself.
	b = newBox(t, policy, lifecycle.ReportServing)
	b.advance(time.Hour)
	want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineNoEvidence), lifecycle.Declined)
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineNoEvidence), lifecycle.IssueSleep)

	// allow_untracked_unload lets automatic unload proceed.
	p := policy
	p.AllowUntrackedUnload = true
	b = newBox(t, p, lifecycle.ReportServing)
	b.advance(time.Hour)
	want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineNoEvidence), lifecycle.IssueSleep)

	// A reload lets the planner judge anew.
	b = newBox(t, policy, lifecycle.ReportServing)
	b.advance(time.Hour)
	b.sleep(lifecycle.IdleTimeout, lifecycle.EngineNoEvidence)
	b.m.Reload(b.now, p)
	b.wantState(lifecycle.Awake)
	want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineNoEvidence), lifecycle.IssueSleep)
}

func TestMachine_RestartWithAnswer(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	b.wantState(lifecycle.Awake)
	id, d := b.arrive(lease.Request{})
	want(t, d, lifecycle.Admit)
	b.finish(id, lease.Outcome{})

	b = newBox(t, policy, lifecycle.ReportAsleep)
	b.wantState(lifecycle.Sleeping)
	id, d = b.arrive(lease.Request{})
	want(t, d, lifecycle.StartWake)
	b.finish(id, lease.Outcome{})
}

func TestMachine_RestartWithoutAnswer(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportNoAnswer)
	if snap := b.wantState(lifecycle.Unverified); !strings.Contains(snap.Reason, "verified before serving") {
		t.Fatalf("reason = %q", snap.Reason)
	}
	b.advance(time.Hour)
	want(t, b.sleep(lifecycle.IdleTimeout, lifecycle.EngineIdle), lifecycle.Declined)
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	verify := want(t, d, lifecycle.StartWake)
	if verify.Attempt != 1 || !strings.Contains(verify.Reason, "verifying health") {
		t.Fatalf("verification wake = %+v", verify)
	}
	want(t, b.wakeDone(verify.Op, nil), lifecycle.AdmitWaiting)
	b.wantState(lifecycle.Awake)
	b.finish(id, lease.Outcome{})

	// A wake in flight before a reconcile answers nothing afterwards.
	b = newBox(t, policy, lifecycle.ReportAsleep)
	_, d = b.arrive(lease.Request{})
	b.m.Reconcile(b.now, lifecycle.ReportNoAnswer)
	if d := b.wakeDone(d.Op, nil); d.Action != lifecycle.None {
		t.Fatalf("pre-reconcile wake result = %v", d.Action)
	}
	b.wantState(lifecycle.Unverified)
}

func TestMachine_EngineExited(t *testing.T) {
	// Awake, nobody waiting: stop admitting, sleep with the reason.
	b := newBox(t, policy, lifecycle.ReportServing)
	want(t, b.m.EngineExited(b.now, "status=137/KILL", b.ev()), lifecycle.None)
	if snap := b.wantState(lifecycle.Sleeping); snap.Reason != "engine exited: status=137/KILL" {
		t.Fatalf("reason = %q", snap.Reason)
	}
	// Awake with demand: wake again.
	b = newBox(t, policy, lifecycle.ReportServing)
	id, _ := b.arrive(lease.Request{})
	want(t, b.m.EngineExited(b.now, "", b.ev()), lifecycle.StartWake)
	b.finish(id, lease.Outcome{Cancelled: true})
	// During a wake: the attempt fails at once.
	b = newBox(t, policy, lifecycle.ReportAsleep)
	_, d := b.arrive(lease.Request{})
	next := want(t, b.m.EngineExited(b.now, "exit 1", b.ev()), lifecycle.StartWake)
	if next.Attempt != 2 || next.Cancel != d.Op || !strings.Contains(next.Reason, "engine exited: exit 1") {
		t.Fatalf("after exit during wake: %+v", next)
	}
	if d := b.wakeDone(d.Op, nil); d.Action != lifecycle.None {
		t.Fatalf("result of the attempt that died = %v", d.Action)
	}
}

// The evidence the planner sees: Active while anything is in flight or
// queued, Idle since the last lease ended; a model never used is idle since
// it was registered.
func TestMachine_PlannerEvidence(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	if e := b.ev(); !e.Idle() || !e.Since.Equal(t0) {
		t.Fatalf("never used: %+v", e)
	}
	b.advance(time.Minute)
	q, d := b.arrive(lease.Request{Kind: request.Chat})
	want(t, d, lifecycle.StartWake)
	if e := b.ev(); e.Active != 1 {
		t.Fatalf("queued for wake: %+v", e)
	}
	want(t, b.wakeDone(d.Op, nil), lifecycle.AdmitWaiting)
	s, _ := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	b.advance(time.Minute)
	b.finish(q, lease.Outcome{})
	if e := b.ev(); e.Active != 1 {
		t.Fatalf("stream left: %+v", e)
	}
	b.advance(time.Minute)
	b.finish(s, lease.Outcome{})
	last := b.now
	b.advance(5 * time.Minute)
	if e := b.ev(); !e.Since.Equal(last) || e.Active != 0 {
		t.Fatalf("idle: %+v, want since %v", e, last)
	}
}

func TestMachine_PolicyClamping(t *testing.T) {
	b := newBox(t, lifecycle.Policy{WakeAttempts: -2, DrainTimeout: -time.Second, ArrivalWhileDraining: "bogus"}, lifecycle.ReportServing)
	if snap := b.m.Snapshot(); snap.Budget != 1 {
		t.Fatalf("budget = %d, want 1", snap.Budget)
	}
	// Unknown arrival policy reads as cancel-drain; a negative drain timeout
	// abandons at the first tick.
	id, _ := b.arrive(lease.Request{})
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.None)
	want(t, b.tick(), lifecycle.AbandonDrain)
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.None)
	late, d := b.arrive(lease.Request{})
	want(t, d, lifecycle.Admit)
	b.finish(id, lease.Outcome{})
	b.finish(late, lease.Outcome{})
	// A zero wake timeout takes the default.
	b.m.EngineExited(b.now, "", b.ev())
	id, d = b.arrive(lease.Request{})
	want(t, d, lifecycle.StartWake)
	b.advance(lifecycle.DefaultWakeTimeout)
	d = want(t, b.tick(), lifecycle.RefuseWaiting)
	if d.Refusal.RetryAfter != lifecycle.MinRetryAfter {
		t.Fatalf("retry after = %v", d.Refusal.RetryAfter)
	}
	b.finish(id, lease.Outcome{Cancelled: true})
}

func TestMachine_Strings(t *testing.T) {
	for s := lifecycle.Awake; s <= lifecycle.Failed; s++ {
		if strings.HasPrefix(s.String(), "State(") {
			t.Errorf("%d has no name", int(s))
		}
	}
	for a := lifecycle.None; a <= lifecycle.Declined; a++ {
		if strings.HasPrefix(a.String(), "Action(") {
			t.Errorf("action %d has no name", int(a))
		}
	}
}

// A wake that cannot fit in GPU memory is aborted before it is attempted:
// no attempt is spent, the model sleeps again, and a stale abort is ignored.
func TestMachine_WakeAbortedForNoRoom(t *testing.T) {
	b := newBox(t, lifecycle.Policy{WakeAttempts: 1}, lifecycle.ReportAsleep)
	id, d := b.arrive(lease.Request{Kind: request.Chat})
	wake := want(t, d, lifecycle.StartWake)
	b.m.WakeAborted(b.now, wake.Op, "cannot fit big (40.0 GiB) on GPU 0")
	snap := b.wantState(lifecycle.Sleeping)
	if snap.Attempts != 0 || !strings.Contains(snap.Reason, "cannot fit") {
		t.Fatalf("snapshot = %+v, want no attempt spent and the reason kept", snap)
	}
	if d := b.m.WakeAborted(b.now, wake.Op, "again"); d.Action != lifecycle.None || !strings.Contains(d.Reason, "stale") {
		t.Fatalf("stale abort = %+v", d)
	}
	b.finish(id, lease.Outcome{Cancelled: true})
	// With a budget of one attempt, a real wake can still run afterwards.
	_, d = b.arrive(lease.Request{Kind: request.Chat})
	want(t, b.wakeDone(want(t, d, lifecycle.StartWake).Op, nil), lifecycle.AdmitWaiting)
}

// Demand (another model waits for the memory) skips the idle minimum that
// guards against unloads nobody asked for, but not the proof of idleness.
func TestMachine_DemandOverridesIdleMinimum(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	id, _ := b.arrive(lease.Request{Kind: request.Chat})
	b.finish(id, lease.Outcome{})
	b.advance(time.Second)
	want(t, b.sleep(lifecycle.MemoryPressure, lifecycle.EngineIdle), lifecycle.Declined)
	d := want(t, b.sleep(lifecycle.Demand, lifecycle.EngineIdle), lifecycle.IssueSleep)
	if d.Sleep.Reason != lifecycle.Demand {
		t.Fatalf("sleep = %+v", d.Sleep)
	}

	b = newBox(t, policy, lifecycle.ReportServing)
	d = want(t, b.sleep(lifecycle.Demand, lifecycle.EngineNoEvidence), lifecycle.Declined)
	if !strings.Contains(d.Reason, "allow_untracked_unload") {
		t.Fatalf("reason = %q, want the missing proof", d.Reason)
	}
	// Engine work without a napd lease is someone else's: declined.
	b = newBox(t, policy, lifecycle.ReportServing)
	want(t, b.sleep(lifecycle.Demand, lifecycle.EngineBusy), lifecycle.Declined)
}

// A busy holder yields: a Demand sleep drains its requests in flight, and
// requests arriving meanwhile are queued for the wake that follows instead
// of cancelling the drain. The drain completes on the requests in flight.
func TestMachine_DemandDrainQueuesArrivals(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	stream, _ := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	d := want(t, b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: lifecycle.Demand},
		lifecycle.Evidence{Leases: b.ev(), Engine: lifecycle.EngineBusy}), lifecycle.None)
	b.wantState(lifecycle.Draining)
	if !strings.Contains(d.Reason, "demand") {
		t.Fatalf("reason = %q", d.Reason)
	}
	late, d := b.arrive(lease.Request{Kind: request.Chat})
	want(t, d, lifecycle.QueueForWake)
	b.wantState(lifecycle.Draining)

	// The stream ends; the queued request holds a lease but is not in
	// flight, so the caller reports no lease in flight.
	b.tr.End(b.now, stream, lease.Outcome{})
	sl := want(t, b.m.LastLeaseEnded(b.now, lease.Evidence{}), lifecycle.IssueSleep)
	// Asleep, the queued request wakes it again (it will wait for room).
	want(t, b.sleepDone(sl.Op, nil), lifecycle.StartWake)
	b.finish(late, lease.Outcome{Cancelled: true})
}

// While a wake waits for GPU memory its wake_timeout does not run; once
// room is found it counts from then, and so does the measured wake time.
func TestMachine_RoomWaitStopsTheWakeClock(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportAsleep)
	_, d := b.arrive(lease.Request{Kind: request.Chat})
	op := want(t, d, lifecycle.StartWake).Op
	if b.m.Snapshot().RoomWait {
		t.Fatal("RoomWait before WaitingForRoom")
	}
	b.m.WaitingForRoom(b.now, op, "held by busy a (20.0 GiB)")
	if s := b.wantState(lifecycle.Waking); !strings.Contains(s.Reason, "busy a") || !s.RoomWait {
		t.Fatalf("reason = %q, room wait %v", s.Reason, s.RoomWait)
	}
	b.advance(time.Hour)
	want(t, b.tick(), lifecycle.None)
	b.m.RoomFound(b.now, op)
	if b.m.Snapshot().RoomWait {
		t.Fatal("RoomWait after RoomFound")
	}
	b.advance(3 * time.Second)
	want(t, b.wakeDone(op, nil), lifecycle.AdmitWaiting)
	if s := b.m.Snapshot(); s.LastWake != 3*time.Second {
		t.Fatalf("last wake = %s, want 3s (the room wait left out)", s.LastWake)
	}
	// Stale notices are ignored.
	if d := b.m.RoomFound(b.now, op); !strings.Contains(d.Reason, "stale") {
		t.Fatalf("stale RoomFound = %+v", d)
	}
	if d := b.m.WaitingForRoom(b.now, op, "x"); !strings.Contains(d.Reason, "stale") {
		t.Fatalf("stale WaitingForRoom = %+v", d)
	}

	// Once room is found, wake_timeout runs again.
	b = newBox(t, policy, lifecycle.ReportAsleep)
	_, d = b.arrive(lease.Request{Kind: request.Chat})
	op = want(t, d, lifecycle.StartWake).Op
	b.m.WaitingForRoom(b.now, op, "held by busy a")
	b.m.RoomFound(b.now, op)
	b.advance(policy.WakeTimeout)
	want(t, b.tick(), lifecycle.StartWake) // attempt 1 failed; the lease still waits: the next one
	if s := b.m.Snapshot(); s.Attempts != 1 {
		t.Fatalf("attempts = %d, want 1 after the timeout", s.Attempts)
	}
}

// A yield nobody needs any more is taken back before its sleep is issued:
// the model serves again; once the sleep call is out it is too late.
func TestMachine_CancelYield(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	stream, _ := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: lifecycle.Demand}, lifecycle.Evidence{Leases: b.ev(), Engine: lifecycle.EngineBusy})
	if !b.m.Snapshot().Yielding {
		t.Fatal("a Demand drain is not shown as yielding")
	}
	want(t, b.m.CancelYield(b.now), lifecycle.AbandonDrain)
	if s := b.wantState(lifecycle.Awake); s.Yielding {
		t.Fatal("still yielding after the cancel")
	}
	want(t, b.m.CancelYield(b.now), lifecycle.None)

	// An operator drain is not a yield: not cancelled.
	b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: lifecycle.Operator}, lifecycle.Evidence{Leases: b.ev(), Engine: lifecycle.EngineIdle})
	want(t, b.m.CancelYield(b.now), lifecycle.None)
	b.wantState(lifecycle.Draining)
	b.finish(stream, lease.Outcome{})
}

// The reason of an unsupported model says what is missing, and a busy
// engine's decline says what it is busy with.
func TestMachine_EvidenceDetail(t *testing.T) {
	b := newBox(t, policy, lifecycle.ReportServing)
	b.advance(time.Hour)
	missing := "no socket listens on 127.0.0.1:8001 in napd's network namespace"
	d := b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: lifecycle.IdleTimeout},
		lifecycle.Evidence{Leases: b.ev(), Engine: lifecycle.EngineNoEvidence, Detail: missing})
	want(t, d, lifecycle.Declined)
	if snap := b.wantState(lifecycle.Unsupported); !strings.Contains(snap.Reason, "unsupported: "+missing+", so requests bypassing napd") {
		t.Fatalf("reason = %q", snap.Reason)
	}
	outside := "in use outside napd: 127.0.0.1:54012 (pid 4711, curl)"
	d = b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: lifecycle.IdleTimeout},
		lifecycle.Evidence{Leases: b.ev(), Engine: lifecycle.EngineBusy, Detail: outside})
	if d.Action != lifecycle.Declined || d.Reason != outside {
		t.Fatalf("busy decline = %+v", d)
	}
}

func TestMachine_EngineHung(t *testing.T) {
	// Awake: unverified, one attempt spent; the next arrival restarts it.
	b := newBox(t, policy, lifecycle.ReportServing)
	want(t, b.m.EngineHung(b.now, "3 health probes failed"), lifecycle.None)
	snap := b.wantState(lifecycle.Unverified)
	if snap.Attempts != 1 || !strings.Contains(snap.Reason, "engine stopped answering: 3 health probes failed") {
		t.Fatalf("after hung: %+v", snap)
	}
	id, d := b.arrive(lease.Request{})
	wake := want(t, d, lifecycle.StartWake)
	if wake.Attempt != 2 {
		t.Fatalf("restart is attempt %d, want 2 (one spent)", wake.Attempt)
	}
	want(t, b.wakeDone(wake.Op, nil), lifecycle.AdmitWaiting)
	if snap := b.wantState(lifecycle.Awake); snap.Attempts != 0 {
		t.Fatalf("attempts after a verified wake = %d", snap.Attempts)
	}
	b.finish(id, lease.Outcome{})

	// Not awake: nothing to do.
	b = newBox(t, policy, lifecycle.ReportAsleep)
	want(t, b.m.EngineHung(b.now, "x"), lifecycle.None)
	b.wantState(lifecycle.Sleeping)

	// With the budget spent: failed.
	p := policy
	p.WakeAttempts = 1
	b = newBox(t, p, lifecycle.ReportServing)
	want(t, b.m.EngineHung(b.now, "x"), lifecycle.RefuseWaiting)
	b.wantState(lifecycle.Failed)
}

// Retry-After comes from the learned figures the loop hands in, and from
// where the model is: a drain's remaining time, a failure's age.
func TestMachine_RetryAfterLearned(t *testing.T) {
	p := policy
	p.ArrivalWhileDraining = lifecycle.ArrivalRefuse
	b := newBox(t, p, lifecycle.ReportServing)
	b.m.Learn(20*time.Second, 4*time.Second)
	stream, _ := b.arrive(lease.Request{Kind: request.Chat, Stream: true})
	want(t, b.sleep(lifecycle.Operator, lifecycle.EngineIdle), lifecycle.None)
	retry := func(wantCode string, wantRetry time.Duration) {
		t.Helper()
		id, d := b.arrive(lease.Request{})
		want(t, d, lifecycle.Refuse)
		if r := d.Refusal; r.Code != wantCode || r.RetryAfter != wantRetry {
			t.Fatalf("refusal = %+v, want %s after %v", r, wantCode, wantRetry)
		}
		b.finish(id, lease.Outcome{Cancelled: true})
	}
	// The drain ends with the request in flight: a typical request.
	retry(lifecycle.CodeModelDraining, 4*time.Second)
	// Near drain_timeout, the drain's deadline comes first.
	b.advance(p.DrainTimeout - 2*time.Second)
	retry(lifecycle.CodeModelDraining, 2*time.Second)
	// Past it, the least hint, never less.
	b.advance(5 * time.Second)
	retry(lifecycle.CodeModelDraining, lifecycle.MinRetryAfter)
	// With the sleep call in flight a retry wakes the model: at once.
	d := want(t, b.finish(stream, lease.Outcome{}), lifecycle.IssueSleep)
	retry(lifecycle.CodeModelDraining, lifecycle.MinRetryAfter)
	want(t, b.sleepDone(d.Op, nil), lifecycle.None)

	// Failed: a typical wake at the failure, growing with its age.
	failing := func(wantRetry time.Duration) {
		t.Helper()
		id, d := b.arrive(lease.Request{})
		for range p.WakeAttempts {
			d = b.wakeDone(d.Op, errUnhealthy)
		}
		want(t, d, lifecycle.RefuseWaiting)
		if d.Refusal.RetryAfter != wantRetry {
			t.Fatalf("retry after at the failure = %v, want %v", d.Refusal.RetryAfter, wantRetry)
		}
		b.finish(id, lease.Outcome{Cancelled: true})
	}
	failing(20 * time.Second) // the typical wake
	b.advance(time.Minute)
	retry(lifecycle.CodeModelFailed, time.Minute+20*time.Second)
	b.advance(time.Hour)
	retry(lifecycle.CodeModelFailed, lifecycle.MaxRetryAfter)
	// Nothing learned: the last verified wake stands in for a typical one.
	b.m.Learn(0, 0)
	want(t, b.m.Reset(b.now), lifecycle.None)
	id, d := b.arrive(lease.Request{})
	b.advance(9 * time.Second)
	want(t, b.wakeDone(d.Op, nil), lifecycle.AdmitWaiting)
	b.finish(id, lease.Outcome{})
	b.m.EngineExited(b.now, "killed", b.ev())
	failing(9 * time.Second) // the last verified wake
}

// The idle minimum counts from the engine's last activity seen outside
// napd, when that is later than the model's own last use: a client that
// bypassed napd a moment ago makes the model too recently used to evict.
func TestMachine_IdleMinimumFromOutsideActivity(t *testing.T) {
	b := newBox(t, lifecycle.Policy{IdleMinimum: time.Minute, DrainTimeout: time.Second, WakeAttempts: 1}, lifecycle.ReportServing)
	b.advance(time.Hour)
	outside := b.now.Add(-10 * time.Second)
	d := b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: lifecycle.MemoryPressure},
		lifecycle.Evidence{Leases: b.ev(), Engine: lifecycle.EngineIdle, ActiveAt: outside})
	if d.Action != lifecycle.Declined || !strings.Contains(d.Reason, "idle for 10s, under the idle minimum") {
		t.Fatalf("an engine used outside napd 10 s ago: %+v; want declined under the idle minimum", d)
	}
	b.advance(time.Minute)
	want(t, b.m.RequestSleep(b.now, lifecycle.SleepRequest{Reason: lifecycle.MemoryPressure},
		lifecycle.Evidence{Leases: b.ev(), Engine: lifecycle.EngineIdle, ActiveAt: outside}), lifecycle.IssueSleep)
}
