// Package lifecycle is the per-model state machine that decides when a model
// may serve and when it may sleep: awake, draining, sleeping, waking,
// unverified, unsupported, failed (see State).
//
// A Machine owns no clock, socket, goroutine or lock: the model's owner loop
// (one goroutine per model) feeds it events with the current monotonic time
// and, where it matters, fresh lease evidence from the lease.Tracker, and
// performs what each returned Decision asks:
//
//	m := lifecycle.New(now, policy)
//	m.Reconcile(now, report)                 // at start, from the supervisor
//	d := m.Arrive(now)                       // after tracker.Begin -> Started
//	switch d.Action {
//	case lifecycle.Admit:        // forward the request
//	case lifecycle.StartWake:    // go wake(d.Op, d.Attempt); queue the request
//	case lifecycle.QueueForWake: // queue the request
//	case lifecycle.Refuse:       // 503 d.Refusal; End its lease
//	}
//	m.WakeDone(now, op, err, ev)     // AdmitWaiting | StartWake (next attempt) | RefuseWaiting | None
//	m.WakeAborted(now, op, why)      // no GPU room: Sleeping, no attempt spent; refuse the queue
//	m.LastLeaseEnded(now, ev)        // after tracker.End -> Idle: may IssueSleep
//	m.RequestSleep(now, req, ev)     // planner or operator: IssueSleep | Declined | None
//	m.SleepDone(now, op, err, ev)    // may StartWake if demand arrived meanwhile
//	m.EngineExited(now, reason, ev)  // unexpected exit only (not a stop napd asked for)
//	m.EngineHung(now, why)           // awake, failing health, no progress (Watch)
//	m.EngineSlept(now, why, ev)      // it slept by itself (llama.cpp): Sleeping, or a wake for waiting leases
//	m.Tick(now, ev)                  // periodically: drain and wake deadlines
//	m.Reset(now); m.Reload(now, p)   // operator reset, config reload
//	m.Learn(wake, request)           // after a wake or request is measured
//
// ev is always the tracker's evidence read while handling the event. Live
// leases count as demand: after a failed attempt, a confirmed sleep or an
// engine exit, a live lease makes the machine start the next wake.
//
// A lease begun by a gateway goroutine but not yet announced with Arrive may
// be missed by the evidence the loop reads; that request has not reached the
// engine, and its Arrive will queue it behind any sleep issued meanwhile, so a
// sleep never cuts off a request the engine is serving.
//
// Wakes and sleeps carry an Op tag; a result with a tag other than the one in
// flight (late, duplicated, or from before a reconcile) is ignored.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/napd/napd/agent/lease"
)

// Machine is one model's lifecycle. Not safe for concurrent use: one owner
// serialises every call.
type Machine struct {
	policy Policy
	state  State
	reason string
	since  time.Time

	attempts int // failed wake attempts since the last verified wake, reset or reload
	lastOp   Op  // source of Op tags
	op       Op  // the wake or sleep in flight; 0 when none

	wakeStart     time.Time
	wakeDeadline  time.Time
	drainDeadline time.Time
	sleep         SleepRequest // the sleep being drained for or issued
	awakeSince    time.Time    // when the model last became verified awake
	lastWake      time.Duration

	// The loop's learned figures (Learn), for Retry-After: the typical
	// verified wake and granted request; 0 = none measured yet.
	typicalWake    time.Duration
	typicalRequest time.Duration
}

// New returns a Machine for a model napd knows nothing about yet: Unverified
// until Reconcile says otherwise.
func New(now time.Time, p Policy) *Machine {
	m := &Machine{policy: p.normalized()}
	m.set(now, Unverified, "not reconciled yet")
	return m
}

// Snapshot describes the machine for status, metrics and events.
func (m *Machine) Snapshot() Snapshot {
	return Snapshot{
		State: m.state, Reason: m.reason, Since: m.since,
		Attempts: m.attempts, Budget: m.policy.WakeAttempts, LastWake: m.lastWake,
		// A wake's clock stops only while it waits for room.
		RoomWait:   m.state == Waking && m.wakeDeadline.IsZero(),
		Yielding:   m.state == Draining && m.sleep.Reason == Demand,
		AwakeSince: m.awakeSince,
	}
}

// Learn hands the machine what the owner loop has learned: the typical
// duration of the model's recent verified wakes and of its granted requests
// (0 = none measured yet). Refusals take their Retry-After from them.
func (m *Machine) Learn(wake, request time.Duration) {
	m.typicalWake, m.typicalRequest = wake, request
}

// Reconcile sets the state from the supervisor's report at napd's start (or
// whenever the owner loop re-adopts the engine). Anything in flight before is
// forgotten; its late results are ignored.
func (m *Machine) Reconcile(now time.Time, r Report) Decision {
	m.op = 0
	m.attempts = 0
	switch r {
	case ReportServing:
		m.awakeSince = now
		m.set(now, Awake, "serving and healthy at start")
	case ReportAsleep:
		m.set(now, Sleeping, "asleep at start")
	default:
		m.set(now, Unverified, "no answer at start: health is verified before serving")
	}
	return Decision{Reason: m.reason}
}

// Arrive handles a request that holds a lease and asks to be served. An
// operator wake (napctl wake) is an Arrive with no request behind it.
func (m *Machine) Arrive(now time.Time) Decision {
	switch m.state {
	case Awake, Unsupported:
		return Decision{Action: Admit}
	case Draining:
		if m.sleep.Reason == Demand {
			return Decision{Action: QueueForWake, Reason: "yielding the GPU to waiting requests: queued for the wake that follows"}
		}
		if m.policy.ArrivalWhileDraining == ArrivalRefuse {
			return m.refuse(now, CodeModelDraining, "draining for sleep ("+m.sleep.Reason.String()+")")
		}
		if m.op != 0 { // the sleep call is in flight: it cannot be taken back
			return Decision{Action: QueueForWake, Reason: "going to sleep: queued for the wake that follows"}
		}
		m.set(now, Awake, "drain cancelled by an arrival")
		return Decision{Action: Admit, Reason: m.reason}
	case Sleeping:
		return m.startWake(now, "woken by a request")
	case Unverified:
		return m.startWake(now, "verifying health before serving")
	case Waking:
		return Decision{Action: QueueForWake}
	case Failed:
		return m.refuse(now, CodeModelFailed, m.reason)
	}
	return Decision{}
}

// LastLeaseEnded handles the tracker reporting the model idle: a drain that
// was waiting for its leases issues the sleep.
func (m *Machine) LastLeaseEnded(now time.Time, leases lease.Evidence) Decision {
	if m.state == Draining && m.op == 0 && leases.Active == 0 {
		return m.issueSleep(now)
	}
	return Decision{}
}

// RequestSleep handles a sleep request with its evidence. Engine-reported
// work declines it, except a Demand one's while napd's own leases are live.
// An automatic one (IdleTimeout, MemoryPressure) is also declined by live
// leases or an idle time under the idle minimum, and without engine evidence
// (unless allow_untracked_unload) it moves the model to Unsupported; a
// Demand one is declined only by the missing evidence. Operator and Demand
// ones drain live leases first. With no lease live the sleep is issued at
// once.
func (m *Machine) RequestSleep(now time.Time, req SleepRequest, ev Evidence) Decision {
	switch m.state {
	case Awake, Unsupported:
	case Draining:
		return Decision{Reason: "already draining"}
	case Sleeping:
		return Decision{Reason: "already asleep"}
	default:
		return Decision{Action: Declined, Reason: "cannot sleep while " + m.state.String()}
	}
	if ev.Engine == EngineBusy && (req.Reason != Demand || ev.Leases.Active == 0) {
		// A yielding holder's engine is busy with napd's own requests, which
		// the drain waits for; without a lease the work is someone else's.
		why := "engine reports requests running or waiting"
		if ev.Detail != "" {
			why = ev.Detail
		}
		return Decision{Action: Declined, Reason: why}
	}
	if req.Reason != Operator {
		if ev.Leases.Active > 0 && req.Reason != Demand {
			return Decision{Action: Declined, Reason: fmt.Sprintf("%d requests in flight", ev.Leases.Active)}
		}
		idle := now.Sub(later(m.Snapshot().IdleSince(ev.Leases), ev.ActiveAt))
		if idle < m.policy.IdleMinimum && req.Reason != Demand {
			return Decision{Action: Declined, Reason: fmt.Sprintf("idle for %s, under the idle minimum of %s",
				idle.Round(time.Second), m.policy.IdleMinimum)}
		}
		if ev.Engine == EngineNoEvidence && !m.policy.AllowUntrackedUnload {
			missing := ev.Detail
			if missing == "" {
				missing = "the engine reports no activity"
			}
			why := "automatic unload unsupported: " + missing + ", so requests bypassing napd cannot be ruled out (allow_untracked_unload overrides)"
			if m.state != Unsupported || m.reason != why {
				m.set(now, Unsupported, why)
			}
			return Decision{Action: Declined, Reason: why}
		}
	}
	m.sleep = req
	m.drainDeadline = now.Add(m.policy.DrainTimeout)
	if ev.Leases.Active == 0 {
		return m.issueSleep(now)
	}
	m.set(now, Draining, fmt.Sprintf("draining for sleep (%s): %d requests in flight", req.Reason, ev.Leases.Active))
	return Decision{Reason: m.reason}
}

// WakeDone handles the result of wake op: nil means the engine was woken and
// its health verified. context.DeadlineExceeded in err's chain reads as a
// timeout; any other error is an unhealthy wake and its text is the reason.
func (m *Machine) WakeDone(now time.Time, op Op, err error, leases lease.Evidence) Decision {
	if m.state != Waking || op != m.op {
		return Decision{Reason: fmt.Sprintf("stale wake result (op %d) ignored", op)}
	}
	m.op = 0
	if err != nil {
		why := err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			why = "timed out after " + m.policy.WakeTimeout.String()
		}
		return m.failAttempt(now, why, leases)
	}
	m.attempts = 0
	m.lastWake = now.Sub(m.wakeStart)
	m.awakeSince = now
	m.set(now, Awake, "")
	return Decision{Action: AdmitWaiting, Reason: "woke in " + m.lastWake.String()}
}

// WakeAborted handles a wake op that was never attempted because GPU memory
// cannot be freed for it (busy or pinned models hold it). That is not the
// engine's fault, so no attempt is spent: the model returns to Sleeping and
// the caller refuses the requests queued for the wake with why.
func (m *Machine) WakeAborted(now time.Time, op Op, why string) Decision {
	if m.state != Waking || op != m.op {
		return Decision{Reason: fmt.Sprintf("stale wake abort (op %d) ignored", op)}
	}
	m.op = 0
	m.set(now, Sleeping, "wake refused: "+why)
	return Decision{Reason: m.reason}
}

// CancelYield takes back a Demand sleep whose drain has not issued its
// sleep yet, because nobody waits for the memory any more: the model is
// awake again and the caller admits the requests queued behind the drain
// (AbandonDrain).
func (m *Machine) CancelYield(now time.Time) Decision {
	if m.state != Draining || m.op != 0 || m.sleep.Reason != Demand {
		return Decision{}
	}
	why := "yield cancelled: nobody waits for its memory any more"
	m.set(now, Awake, why)
	return Decision{Action: AbandonDrain, Reason: why}
}

// WaitingForRoom records that wake op waits for GPU memory before it
// starts: why names the holders. The wait is bounded by the waiting
// requests' deadlines (the caller ends it with RoomFound or WakeAborted),
// not by wake_timeout: the wake's clock stops until room is found.
func (m *Machine) WaitingForRoom(now time.Time, op Op, why string) Decision {
	if m.state != Waking || op != m.op {
		return Decision{Reason: fmt.Sprintf("stale room wait (op %d) ignored", op)}
	}
	m.wakeDeadline = time.Time{}
	m.set(now, Waking, "waiting for GPU memory: "+why)
	return Decision{Reason: m.reason}
}

// RoomFound starts wake op's clock again once its memory is free: the
// wake_timeout and the measured wake duration count from now.
func (m *Machine) RoomFound(now time.Time, op Op) Decision {
	if m.state != Waking || op != m.op {
		return Decision{Reason: fmt.Sprintf("stale room found (op %d) ignored", op)}
	}
	m.wakeStart = now
	m.wakeDeadline = now.Add(m.policy.WakeTimeout)
	m.set(now, Waking, "waking: GPU memory is free")
	return Decision{Reason: m.reason}
}

// SleepDone handles the result of sleep op: nil means the engine sleeps. A
// failed sleep leaves the engine in an unknown state: Unverified. Demand
// that arrived meanwhile starts a wake at once.
func (m *Machine) SleepDone(now time.Time, op Op, err error, leases lease.Evidence) Decision {
	if m.state != Draining || op == 0 || op != m.op {
		return Decision{Reason: fmt.Sprintf("stale sleep result (op %d) ignored", op)}
	}
	m.op = 0
	if err != nil {
		return m.settle(now, Unverified, "sleep failed: "+err.Error(), leases)
	}
	return m.settle(now, Sleeping, "asleep ("+m.sleep.Reason.String()+")", leases)
}

// EngineExited handles an engine that exited without napd asking. A serving
// or draining model stops admitting (Sleeping, or a wake if demand waits); a
// wake attempt in flight fails at once. During a sleep call the exit is left
// to the sleep's own result.
func (m *Machine) EngineExited(now time.Time, reason string, leases lease.Evidence) Decision {
	why := "engine exited"
	if reason != "" {
		why += ": " + reason
	}
	switch m.state {
	case Awake, Unsupported, Unverified:
		return m.settle(now, Sleeping, why, leases)
	case Draining:
		if m.op == 0 {
			return m.settle(now, Sleeping, why, leases)
		}
	case Waking:
		return m.abandonWake(now, why, leases)
	}
	return Decision{}
}

// EngineSlept handles a serving engine that went to sleep by itself
// (llama.cpp's idle sleep), or that may have (its own idle time passed):
// it needs a wake again, so the next request goes through the fit check
// first. The model becomes Sleeping, or starts a wake at once when live
// leases wait.
func (m *Machine) EngineSlept(now time.Time, why string, leases lease.Evidence) Decision {
	if m.state != Awake && m.state != Unsupported {
		return Decision{}
	}
	return m.settle(now, Sleeping, why, leases)
}

// EngineHung handles an awake engine that stopped answering its health
// probes while its evidence showed no progress (see Watch): napd no longer
// knows whether it serves. The model becomes Unverified: nothing more is
// admitted, requests in flight end on their own, and the next arrival's
// verification wake restarts the engine. It spends one wake attempt; with
// the budget spent the model is Failed.
func (m *Machine) EngineHung(now time.Time, why string) Decision {
	if m.state != Awake && m.state != Unsupported {
		return Decision{}
	}
	if d, failed := m.spend(now, "engine stopped answering: "+why); failed {
		return d
	}
	m.set(now, Unverified, fmt.Sprintf("engine stopped answering: %s; restarted on the next request (wake attempt %d of %d spent)",
		why, m.attempts, m.policy.WakeAttempts))
	return Decision{Reason: m.reason}
}

// Tick checks deadlines: a drain past drain_timeout is abandoned (the model
// stays awake), a wake past wake_timeout fails its attempt. A drain whose
// leases are all gone issues its sleep, in case the LastLeaseEnded was missed.
func (m *Machine) Tick(now time.Time, leases lease.Evidence) Decision {
	switch {
	case m.state == Draining && m.op == 0:
		if leases.Active == 0 {
			return m.issueSleep(now)
		}
		if !now.Before(m.drainDeadline) {
			why := fmt.Sprintf("drain abandoned after %s: %d requests still in flight", m.policy.DrainTimeout, leases.Active)
			m.set(now, Awake, why)
			return Decision{Action: AbandonDrain, Reason: why}
		}
	case m.state == Waking && !m.wakeDeadline.IsZero() && !now.Before(m.wakeDeadline):
		return m.abandonWake(now, "timed out after "+m.policy.WakeTimeout.String(), leases)
	}
	return Decision{}
}

// Reset is the operator's reset: the attempt count returns to 0 and a failed
// model becomes Sleeping, so the next arrival wakes it.
func (m *Machine) Reset(now time.Time) Decision {
	return m.clear(now, "reset by operator")
}

// Reload applies a reloaded config's policy. Like Reset it clears Failed; an
// Unsupported model becomes Awake so the planner judges it anew.
func (m *Machine) Reload(now time.Time, p Policy) Decision {
	m.policy = p.normalized()
	return m.clear(now, "config reloaded")
}

func (m *Machine) clear(now time.Time, why string) Decision {
	m.attempts = 0
	switch m.state {
	case Failed:
		m.set(now, Sleeping, why)
	case Unsupported:
		m.set(now, Awake, why)
	default:
		return Decision{}
	}
	return Decision{Reason: why}
}

func (m *Machine) startWake(now time.Time, why string) Decision {
	m.lastOp++
	m.op = m.lastOp
	m.wakeStart = now
	m.wakeDeadline = now.Add(m.policy.WakeTimeout)
	m.set(now, Waking, why)
	return Decision{Action: StartWake, Op: m.op, Attempt: m.attempts + 1, Reason: why}
}

func (m *Machine) issueSleep(now time.Time) Decision {
	m.lastOp++
	m.op = m.lastOp
	why := "going to sleep (" + m.sleep.Reason.String() + ")"
	m.set(now, Draining, why)
	return Decision{Action: IssueSleep, Op: m.op, Sleep: m.sleep, Reason: why}
}

// abandonWake fails the wake in flight before its result came, and tells
// the caller to cancel it.
func (m *Machine) abandonWake(now time.Time, why string, leases lease.Evidence) Decision {
	old := m.op
	m.op = 0
	d := m.failAttempt(now, why, leases)
	d.Cancel = old
	return d
}

// failAttempt spends one wake attempt: Failed when the budget is spent
// (queued requests are refused), else the next attempt if demand waits,
// else Sleeping so a later demand can wake it.
func (m *Machine) failAttempt(now time.Time, why string, leases lease.Evidence) Decision {
	if d, failed := m.spend(now, why); failed {
		return d
	}
	return m.settle(now, Sleeping, fmt.Sprintf("wake attempt %d of %d failed: %s", m.attempts, m.policy.WakeAttempts, why), leases)
}

// spend counts one failed attempt. With the budget spent the model is
// Failed and the returned decision refuses the queued requests.
func (m *Machine) spend(now time.Time, why string) (Decision, bool) {
	m.attempts++
	if m.attempts < m.policy.WakeAttempts {
		return Decision{}, false
	}
	m.set(now, Failed, fmt.Sprintf("failed: %s (%d of %d attempts)", why, m.attempts, m.policy.WakeAttempts))
	d := m.refuse(now, CodeModelFailed, m.reason)
	d.Action = RefuseWaiting
	return d, true
}

// settle moves to a non-serving state, or starts a wake when live leases
// show demand waiting.
func (m *Machine) settle(now time.Time, s State, why string, leases lease.Evidence) Decision {
	if leases.Active > 0 {
		return m.startWake(now, why+"; waking for waiting requests")
	}
	m.set(now, s, why)
	return Decision{Reason: why}
}

func (m *Machine) refuse(now time.Time, code, msg string) Decision {
	return Decision{Action: Refuse, Reason: msg, Refusal: &Refusal{
		Status: 503, Code: code, Message: msg, RetryAfter: m.retryAfter(now),
	}}
}

// retryAfter is when a request refused now may be taken:
//   - draining: when the drain ends, that is when the requests in flight
//     end (a typical request) or at drain_timeout, whichever comes first;
//     an arrival after it wakes the model and waits for the wake instead
//     of being refused. With the sleep call already in flight, at once.
//   - failed: only an operator's reset or a reload brings the model back,
//     and then it wakes. The longer a failure has gone unattended, the
//     less likely a reset is soon, so it is the time failed so far plus a
//     typical wake (the last verified wake when the loop has not learned
//     one): clients back off as the failure ages.
//
// Always within [MinRetryAfter, MaxRetryAfter].
func (m *Machine) retryAfter(now time.Time) time.Duration {
	var d time.Duration
	switch m.state {
	case Draining:
		if m.op == 0 {
			d = m.drainDeadline.Sub(now)
			if m.typicalRequest > 0 {
				d = min(d, m.typicalRequest)
			}
		}
	case Failed:
		wake := m.typicalWake
		if wake <= 0 {
			wake = m.lastWake
		}
		d = now.Sub(m.since) + wake
	}
	return min(max(d, MinRetryAfter), MaxRetryAfter)
}

func (m *Machine) set(now time.Time, s State, why string) {
	if s != m.state {
		m.since = now
	}
	m.state, m.reason = s, why
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
