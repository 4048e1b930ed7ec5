package lifecycle_test

import (
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/request"
)

// sim drives a Machine and a Tracker together the way the agent's owner
// loop does, keeps its own account of what is in flight, and checks the
// invariants after every step.
type sim struct {
	t      *testing.T
	now    time.Time
	tr     *lease.Tracker
	m      *lifecycle.Machine
	pol    lifecycle.Policy
	budget int

	admitted map[lease.ID]bool // sent to the engine
	pending  map[lease.ID]bool // begun by a gateway goroutine, not yet announced
	queued   map[lease.ID]bool // waiting for a wake
	wakeOps  []lifecycle.Op    // every wake ever started, for stale results
	sleepOps []lifecycle.Op

	// The sim's own account, independent of the machine's.
	wakeOp    lifecycle.Op // wake in flight, 0 when none
	wakeStart time.Time
	sleepOp   lifecycle.Op // sleep in flight, 0 when none
	verified  bool         // a verified wake (or serving report) since the engine last stopped serving
	failures  int          // failed attempts since the last verified wake, reset or reload
	idleSince time.Time
	idleNotes int // "model idle" notes from End not yet delivered to the loop
	step      int
}

func runSim(t *testing.T, data []byte) {
	if len(data) < 2 {
		return
	}
	pol := lifecycle.Policy{
		DrainTimeout: 30 * time.Second,
		WakeTimeout:  2 * time.Minute,
		WakeAttempts: 1 + int(data[0]%3),
		IdleMinimum:  time.Minute,
	}
	if data[0]&4 != 0 {
		pol.ArrivalWhileDraining = lifecycle.ArrivalRefuse
	}
	pol.AllowUntrackedUnload = data[0]&8 != 0
	s := &sim{
		t: t, now: t0, tr: lease.NewTracker(lease.Options{}), pol: pol, budget: pol.WakeAttempts,
		admitted: map[lease.ID]bool{}, pending: map[lease.ID]bool{}, queued: map[lease.ID]bool{}, idleSince: t0,
	}
	s.tr.Register(model, t0)
	s.m = lifecycle.New(t0, pol)
	report := lifecycle.Report(data[1] % 3)
	s.m.Reconcile(t0, report)
	s.verified = report == lifecycle.ReportServing
	s.check("reconcile")
	for i := 2; i+1 < len(data); i += 2 {
		s.step = i / 2
		s.event(data[i], data[i+1])
	}
}

func (s *sim) ev() lease.Evidence {
	e, _ := s.tr.Evidence(model)
	return e
}

// pick chooses a lease from m, deterministically for a given input.
func pick(m map[lease.ID]bool, arg byte) (lease.ID, bool) {
	if len(m) == 0 {
		return 0, false
	}
	keys := slices.Sorted(maps.Keys(m))
	return keys[int(arg)%len(keys)], true
}

func (s *sim) event(op, arg byte) {
	var name string
	switch op % 13 {
	case 0: // a request arrives
		name = "arrive"
		s.apply(name, s.m.Arrive(s.now), s.begin())
	case 1: // a gateway goroutine begins a lease; the loop hears of it later
		name = "begin"
		if id, ok := pick(s.pending, arg); ok && arg&1 != 0 {
			delete(s.pending, id)
			s.apply("announce", s.m.Arrive(s.now), id)
		} else {
			s.pending[s.begin()] = true
		}
	case 2: // an admitted request finishes or its client leaves
		name = "finish"
		if id, ok := pick(s.admitted, arg); ok {
			delete(s.admitted, id)
			s.end(id)
		}
	case 3: // a queued request's deadline runs out
		name = "give up"
		if id, ok := pick(s.queued, arg); ok {
			delete(s.queued, id)
			s.end(id)
		}
	case 4, 5: // the planner, an operator or a waiting model asks for sleep
		name = "sleep"
		req := lifecycle.SleepRequest{Reason: lifecycle.SleepReason(1 + arg%4), Strategy: "stop"}
		engine := lifecycle.EngineActivity(arg / 3 % 3)
		s.apply(name, s.m.RequestSleep(s.now, req, lifecycle.Evidence{Leases: s.ev(), Engine: engine}), 0)
	case 6: // a wake result, current or stale
		name = "wake done"
		if len(s.wakeOps) == 0 {
			return
		}
		op := s.wakeOps[len(s.wakeOps)-1]
		if arg&0x80 != 0 {
			op = s.wakeOps[int(arg)%len(s.wakeOps)]
		}
		var err error
		if arg&1 != 0 {
			err = errors.New("health check failed")
		}
		accepted := op == s.wakeOp
		if accepted {
			s.wakeOp = 0
			if err != nil {
				s.failures++
			}
		}
		before := s.m.Snapshot()
		d := s.m.WakeDone(s.now, op, err, s.ev())
		s.staleIgnored(name, accepted, before, d)
		if accepted && err == nil && d.Action != lifecycle.AdmitWaiting {
			s.t.Fatalf("step %d: verified wake answered %v", s.step, d.Action)
		}
		s.apply(name, d, 0)
	case 7: // a sleep result, current or stale
		name = "sleep done"
		if len(s.sleepOps) == 0 {
			return
		}
		op := s.sleepOps[len(s.sleepOps)-1]
		if arg&0x80 != 0 {
			op = s.sleepOps[int(arg)%len(s.sleepOps)]
		}
		var err error
		if arg&1 != 0 {
			err = errors.New("sleep: 500")
		}
		accepted := op == s.sleepOp
		if accepted {
			s.sleepOp = 0
		}
		before := s.m.Snapshot()
		d := s.m.SleepDone(s.now, op, err, s.ev())
		s.staleIgnored(name, accepted, before, d)
		s.apply(name, d, 0)
	case 8: // the engine dies; whatever it was serving fails
		name = "exit"
		if s.wakeOp != 0 {
			s.failures++
			s.wakeOp = 0
		}
		if s.sleepOp == 0 {
			s.verified = false
		}
		d := s.m.EngineExited(s.now, "killed", s.ev())
		s.apply(name, d, 0)
		if s.sleepOp == 0 {
			for id := range s.admitted {
				delete(s.admitted, id)
				s.end(id)
			}
		}
	case 9: // time passes, then a tick
		name = "tick"
		s.now = s.now.Add(time.Duration(arg) * time.Second)
		if s.wakeOp != 0 && !s.now.Before(s.wakeStart.Add(s.pol.WakeTimeout)) {
			s.failures++
			s.wakeOp = 0
		}
		s.apply(name, s.m.Tick(s.now, s.drainEv()), 0)
	case 10:
		name = "advance"
		s.now = s.now.Add(time.Duration(arg) * 10 * time.Second)
	case 12: // the loop reads an earlier "model idle" note
		name = "idle note"
		if s.idleNotes > 0 {
			s.idleNotes--
			s.apply(name, s.m.LastLeaseEnded(s.now, s.ev()), 0)
		}
	case 11:
		name = "reset"
		if arg&2 != 0 { // nobody waits for the memory any more
			name = "cancel yield"
			s.apply(name, s.m.CancelYield(s.now), 0)
			break
		}
		s.failures = 0
		if arg&1 != 0 {
			s.m.Reload(s.now, s.pol)
		} else {
			s.m.Reset(s.now)
		}
	}
	s.check(name)
}

// staleIgnored: a result for an operation not in flight changes nothing.
func (s *sim) staleIgnored(name string, accepted bool, before lifecycle.Snapshot, d lifecycle.Decision) {
	if accepted {
		return
	}
	if d.Action != lifecycle.None || s.m.Snapshot() != before {
		s.t.Fatalf("step %d: stale %s acted: %v, %+v -> %+v", s.step, name, d.Action, before, s.m.Snapshot())
	}
}

func (s *sim) begin() lease.ID {
	a, err := s.tr.Begin(s.now, lease.Request{Model: model, Kind: request.Chat})
	if err != nil || a.Verdict != lease.Started {
		s.t.Fatalf("step %d: Begin = %+v, %v", s.step, a, err)
	}
	return a.ID
}

// end releases a lease, as the agent does when a request leaves, and feeds
// the machine when the model went idle: at once, or (every third step) as a
// note the loop reads later, after other leases may have begun.
func (s *sim) end(id lease.ID) {
	e, ok := s.tr.End(s.now, id, lease.Outcome{})
	if !ok {
		s.t.Fatalf("step %d: End(%d) not live", s.step, id)
	}
	if !e.Idle {
		// A yield's drain ends with its last request in flight, though
		// requests queued behind it hold leases.
		if s.m.Snapshot().Yielding && len(s.admitted) == 0 {
			s.apply("last request in flight ended", s.m.LastLeaseEnded(s.now, s.drainEv()), 0)
		}
		return
	}
	s.idleSince = s.now
	if s.step%3 == 0 {
		s.idleNotes++
		return
	}
	s.apply("last lease ended", s.m.LastLeaseEnded(s.now, s.ev()), 0)
}

// drainEv is the evidence the agent's loop gives a drain: while yielding,
// only the requests in flight count.
func (s *sim) drainEv() lease.Evidence {
	ev := s.ev()
	if s.m.Snapshot().Yielding {
		ev.Active = len(s.admitted)
	}
	return ev
}

// apply performs a decision. arriving is the lease of the request that
// caused it (0 when the event was not an arrival).
func (s *sim) apply(name string, d lifecycle.Decision, arriving lease.ID) {
	snap := s.m.Snapshot()
	fail := func(what string) {
		s.t.Helper()
		s.t.Fatalf("step %d (%s): %s; decision %+v; snapshot %+v", s.step, name, what, d, snap)
	}
	switch d.Action {
	case lifecycle.Admit:
		if arriving == 0 || !s.verified || !snap.State.Serving() {
			fail("admitted without a verified wake")
		}
		s.admitted[arriving] = true
	case lifecycle.QueueForWake:
		s.queued[arriving] = true
	case lifecycle.StartWake:
		if s.wakeOp != 0 || s.sleepOp != 0 {
			fail("wake started with another operation in flight")
		}
		if d.Attempt != s.failures+1 {
			fail("wrong attempt number")
		}
		if arriving != 0 {
			s.queued[arriving] = true
		}
		s.wakeOp, s.wakeStart, s.verified = d.Op, s.now, false
		s.wakeOps = append(s.wakeOps, d.Op)
	case lifecycle.IssueSleep:
		yield := d.Sleep.Reason == lifecycle.Demand
		if len(s.admitted) != 0 || (!yield && (s.ev().Active != 0 || len(s.queued) != 0)) {
			fail("sleep issued with a live lease")
		}
		if s.wakeOp != 0 || s.sleepOp != 0 {
			fail("sleep issued with another operation in flight")
		}
		s.sleepOp, s.verified = d.Op, false
		s.sleepOps = append(s.sleepOps, d.Op)
	case lifecycle.AdmitWaiting:
		if !snap.State.Serving() {
			fail("admitted waiting requests while not serving")
		}
		s.verified, s.failures = true, 0
		for id := range s.queued {
			delete(s.queued, id)
			s.admitted[id] = true
		}
	case lifecycle.AbandonDrain:
		// The model serves again: requests queued behind a yield are
		// admitted (the loop dispatches them).
		if !snap.State.Serving() {
			fail("drain abandoned into a state that does not serve")
		}
		for id := range s.queued {
			delete(s.queued, id)
			s.admitted[id] = true
		}
	case lifecycle.Refuse, lifecycle.RefuseWaiting:
		if d.Refusal == nil || d.Refusal.Status != 503 || d.Refusal.RetryAfter <= 0 {
			fail("refusal without 503 and a retry hint")
		}
		if d.Action == lifecycle.RefuseWaiting && s.failures != s.budget {
			fail("failed before the attempt budget was spent")
		}
		if arriving != 0 {
			s.end(arriving)
		}
		if d.Action == lifecycle.RefuseWaiting {
			for id := range s.queued {
				delete(s.queued, id)
				s.end(id)
			}
		}
	}
}

func (s *sim) check(name string) {
	s.t.Helper()
	snap := s.m.Snapshot()
	ev := s.ev()
	fail := func(what string) {
		s.t.Helper()
		s.t.Fatalf("step %d (%s): %s; snapshot %+v; evidence %+v; admitted %d queued %d",
			s.step, name, what, snap, ev, len(s.admitted), len(s.queued))
	}
	if ev.Active < 0 || ev.Active != len(s.admitted)+len(s.queued)+len(s.pending) {
		fail("lease count disagrees with the requests in flight")
	}
	if ev.Active == 0 && !ev.Since.Equal(s.idleSince) {
		fail("idle since is not the last lease's end")
	}
	if snap.Attempts != s.failures || (snap.State == lifecycle.Failed) != (s.failures >= s.budget) {
		fail("attempts or failed state disagree with the failures seen")
	}
	if len(s.admitted) > 0 && (!s.verified || s.sleepOp != 0 ||
		!(snap.State.Serving() || snap.State == lifecycle.Draining)) {
		fail("requests at an engine that is not verified serving")
	}
	if len(s.queued) > 0 && snap.State != lifecycle.Waking && (snap.State != lifecycle.Draining || (s.sleepOp == 0 && !snap.Yielding)) {
		fail("queued requests with no wake coming")
	}
	if (snap.State == lifecycle.Waking) != (s.wakeOp != 0) {
		fail("waking disagrees with the wake in flight")
	}
	if s.sleepOp != 0 && snap.State != lifecycle.Draining {
		fail("sleep in flight outside draining")
	}
}

// FuzzLifecycle feeds random event sequences to a Machine and a Tracker and
// checks the invariants after every step.
func FuzzLifecycle(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 6, 0, 2, 0, 10, 20, 4, 1})           // wake, serve, idle sleep
	f.Add([]byte{0, 2, 0, 0, 4, 2, 0, 0, 2, 0, 7, 0})             // drain, cancel
	f.Add([]byte{4, 2, 0, 0, 4, 2, 7, 0, 2, 1})                   // refuse during drain
	f.Add([]byte{2, 1, 0, 0, 6, 1, 6, 1, 6, 1, 0, 0, 11, 0})      // failed, reset
	f.Add([]byte{0, 1, 0, 0, 9, 200, 9, 200, 8, 0, 6, 0x81})      // timeouts, exit, stale
	f.Add([]byte{0, 2, 10, 9, 5, 1, 0, 0, 7, 1, 6, 0, 7, 0x80})   // sleep fails, late confirm
	f.Add([]byte{8, 2, 10, 20, 4, 0, 0, 0, 11, 1, 4, 0, 7, 0})    // unsupported, reload
	f.Add([]byte{0, 0, 0, 0, 0, 1, 3, 0, 6, 0, 2, 0, 2, 1, 9, 5}) // unverified start
	f.Add([]byte{0, 1, 0, 0, 6, 0, 4, 3, 0, 0, 2, 0, 7, 0, 6, 0}) // yield: queue, sleep, wake
	f.Add([]byte{0, 1, 0, 0, 6, 0, 4, 3, 0, 0, 11, 2, 2, 0})      // yield cancelled
	f.Fuzz(runSim)
}

// TestMachine_RandomSequences runs many seeded random sequences through the
// same checks on every test run.
func TestMachine_RandomSequences(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 11))
	for range 3000 {
		data := make([]byte, 2+2*rng.IntN(120))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		runSim(t, data)
	}
}
