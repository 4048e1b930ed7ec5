package lifecycle

import (
	"fmt"
	"time"

	"github.com/napd/napd/agent/lease"
)

// State is where a model is in its lifecycle.
type State int

const (
	// Awake: a verified healthy engine serves; arrivals are admitted.
	Awake State = iota + 1
	// Draining: a sleep was decided. No new request reaches the engine;
	// the live leases are finishing (then the sleep is issued), or the sleep
	// call is in flight. A drain that outlasts drain_timeout is abandoned.
	Draining
	// Sleeping: the engine does not serve (stopped, or in its own sleep
	// mode); the next arrival starts a wake.
	Sleeping
	// Waking: a wake attempt is in flight; arrivals queue for it. Only a
	// verified healthy result makes the model Awake.
	Waking
	// Unverified: napd does not know whether the engine serves (no answer at
	// restart, or a sleep call that failed). Nothing is admitted until a
	// verification wake, started by the first arrival, proves it healthy.
	Unverified
	// Unsupported: awake and serving, but automatic unload is refused
	// because idleness cannot be proven (the engine reports no activity and
	// clients may bypass napd). An operator sleep still works.
	Unsupported
	// Failed: wake_attempts attempts in a row failed. Arrivals are refused
	// with the reason and the attempt count until an operator reset or a
	// config reload.
	Failed
)

func (s State) String() string {
	switch s {
	case Awake:
		return "awake"
	case Draining:
		return "draining"
	case Sleeping:
		return "sleeping"
	case Waking:
		return "waking"
	case Unverified:
		return "unverified"
	case Unsupported:
		return "unsupported"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// States is every state, in the order status output and metrics list
// them.
func States() []State {
	return []State{Awake, Draining, Sleeping, Waking, Unverified, Unsupported, Failed}
}

// Serving reports whether a model in state s admits arrivals.
func (s State) Serving() bool { return s == Awake || s == Unsupported }

// ArrivalPolicy is policy.arrival_while_draining.
type ArrivalPolicy string

const (
	// ArrivalCancelDrain: an arrival during a drain wins: the drain is cancelled
	// and the request admitted (or, once the sleep call is in flight,
	// queued for the wake that follows it).
	ArrivalCancelDrain ArrivalPolicy = "cancel-drain"
	// ArrivalRefuse: an arrival during a drain is refused with 503 and a retry hint.
	ArrivalRefuse ArrivalPolicy = "refuse"
)

// Defaults applied by New and Reload where a Policy field is out of range.
const (
	DefaultWakeTimeout = 10 * time.Minute
)

// Bounds of a refusal's Retry-After, which is derived from what the loop
// learned (see Machine.Learn): Retry-After is whole seconds, and a client
// told to wait longer than MaxRetryAfter would rather ask again.
const (
	MinRetryAfter = time.Second
	MaxRetryAfter = 10 * time.Minute
)

// Policy is one model's effective lifecycle policy.
type Policy struct {
	DrainTimeout         time.Duration // drain_timeout; < 0 is 0 (abandon at the first tick)
	WakeTimeout          time.Duration // wake_timeout, per attempt; <= 0 is DefaultWakeTimeout
	WakeAttempts         int           // wake_attempts; < 1 is 1
	ArrivalWhileDraining ArrivalPolicy // anything but ArrivalRefuse is ArrivalCancelDrain
	AllowUntrackedUnload bool          // allow_untracked_unload
	// IdleMinimum: an automatic sleep is declined until the model has been
	// idle this long since its last lease ended or its last wake, whichever
	// is later (anti-flap). < 0 is 0.
	IdleMinimum time.Duration
}

func (p Policy) normalized() Policy {
	p.DrainTimeout = max(p.DrainTimeout, 0)
	p.IdleMinimum = max(p.IdleMinimum, 0)
	p.WakeAttempts = max(p.WakeAttempts, 1)
	if p.WakeTimeout <= 0 {
		p.WakeTimeout = DefaultWakeTimeout
	}
	if p.ArrivalWhileDraining != ArrivalRefuse {
		p.ArrivalWhileDraining = ArrivalCancelDrain
	}
	return p
}

// SleepReason says why a sleep is requested.
type SleepReason int

const (
	// IdleTimeout: the planner found the model idle past its idle_timeout.
	IdleTimeout SleepReason = iota + 1
	// MemoryPressure: the planner needs the memory (host, GPU, or a wake
	// that does not fit).
	MemoryPressure
	// Operator: napctl sleep. It skips the idle minimum and the proof of
	// idleness (the operator takes that responsibility) and drains live
	// leases instead of being declined by them.
	Operator
	// Demand: another model's waiting requests need the memory (the
	// planner's room plan). It skips the idle minimum, which only guards
	// against unloads nobody asked for, but keeps the proof of idleness;
	// live leases are drained (the holder yields), and requests arriving
	// during the drain are queued for the wake that follows instead of
	// cancelling it. The caller's lease evidence for a Demand drain counts
	// the requests in flight, not the ones queued behind the drain.
	Demand
)

func (r SleepReason) String() string {
	switch r {
	case IdleTimeout:
		return "idle timeout"
	case MemoryPressure:
		return "memory pressure"
	case Operator:
		return "operator request"
	case Demand:
		return "demand"
	}
	return fmt.Sprintf("SleepReason(%d)", int(r))
}

// SleepRequest asks for a model to sleep.
type SleepRequest struct {
	Reason SleepReason
	// Strategy is how to sleep (a sleepmode value, e.g. "stop" under
	// host-memory pressure instead of the model's "vllm-l1"). Opaque here:
	// it is handed back in the IssueSleep decision.
	Strategy string
	// Cause is the caller's finer reason (e.g. the planner's
	// "gpu-pressure"), handed back like Strategy for logs and metrics.
	Cause string
}

// EngineActivity is what the engine itself says about work in flight
// (e.g. vllm:num_requests_running and _waiting).
type EngineActivity int

const (
	// EngineNoEvidence: the engine reports nothing usable, so requests that
	// bypass napd cannot be ruled out.
	EngineNoEvidence EngineActivity = iota
	// EngineIdle: the engine reports nothing running or waiting.
	EngineIdle
	// EngineBusy: the engine reports work running or waiting.
	EngineBusy
)

func (a EngineActivity) String() string {
	switch a {
	case EngineIdle:
		return "idle"
	case EngineBusy:
		return "busy"
	}
	return "no evidence"
}

// Evidence is what a sleep request is judged on.
type Evidence struct {
	Leases lease.Evidence
	Engine EngineActivity
	// Detail says what the engine evidence is, or what is missing for
	// it, for reasons: "in use outside napd: 127.0.0.1:54012 (pid 4711,
	// curl)", "no socket listens on 127.0.0.1:8001 …". "" when nothing to
	// say.
	Detail string
	// ActiveAt is when the engine was last seen at work by evidence
	// beside the leases (a client that bypassed napd); zero: never. Idle
	// time counts from it when it is later than the model's own last use.
	ActiveAt time.Time
}

// Report is what the supervisor says about an engine at napd's start.
type Report int

const (
	// ReportNoAnswer: the supervisor could not tell, or the engine runs but
	// its health is not proven. Health is verified before serving.
	ReportNoAnswer Report = iota
	// ReportAsleep: the engine is stopped or in its sleep mode.
	ReportAsleep
	// ReportServing: the engine runs and answered its health check.
	ReportServing
)

// Op tags a wake or sleep the caller performs; the result is handed back
// with it, so a late or duplicate result for an older operation is ignored.
type Op uint64

// Action is what a Decision asks the caller to do.
type Action int

const (
	// None: nothing to do; Reason may say why (e.g. a stale result ignored).
	None Action = iota
	// Admit: send the arriving request to the engine now.
	Admit
	// QueueForWake: hold the arriving request until AdmitWaiting or
	// RefuseWaiting (it keeps its lease and its own deadline).
	QueueForWake
	// StartWake: start wake attempt Attempt, tagged Op (supervisor wake plus
	// verified health), and report it with WakeDone. The arriving request,
	// if the event was an arrival, queues for it like QueueForWake.
	StartWake
	// IssueSleep: put the engine to sleep with Sleep.Strategy, tagged Op,
	// and report it with SleepDone. No lease is live.
	IssueSleep
	// AbandonDrain: the drain did not finish in drain_timeout; the model
	// stays awake. Nothing to undo: report it.
	AbandonDrain
	// Refuse: refuse the arriving request with Refusal.
	Refuse
	// AdmitWaiting: a wake was verified healthy; admit every queued request.
	AdmitWaiting
	// RefuseWaiting: the model failed; refuse every queued request with
	// Refusal.
	RefuseWaiting
	// Declined: the sleep request is declined; Reason says why.
	Declined
)

func (a Action) String() string {
	switch a {
	case None:
		return "none"
	case Admit:
		return "admit"
	case QueueForWake:
		return "queue-for-wake"
	case StartWake:
		return "start-wake"
	case IssueSleep:
		return "issue-sleep"
	case AbandonDrain:
		return "abandon-drain"
	case Refuse:
		return "refuse"
	case AdmitWaiting:
		return "admit-waiting"
	case RefuseWaiting:
		return "refuse-waiting"
	case Declined:
		return "declined"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decision is a Machine's answer to one event.
type Decision struct {
	Action Action
	// Op tags the wake (StartWake) or sleep (IssueSleep) to perform.
	Op Op
	// Attempt is the 1-based wake attempt (StartWake).
	Attempt int
	// Cancel, when not 0, is a wake the machine gave up on (timed out, or
	// its engine exited): cancel that call; its late result is ignored.
	Cancel Op
	// Sleep is the sleep to issue (IssueSleep).
	Sleep SleepRequest
	// Refusal is the error for the refused request(s) (Refuse, RefuseWaiting).
	Refusal *Refusal
	// Reason explains the decision for logs and status; it never contains
	// request content.
	Reason string
}

// Refusal codes.
const (
	CodeModelFailed   = "model_failed"
	CodeModelDraining = "model_draining"
)

// Refusal is a request the model cannot take. The gateway answers Status
// with an OpenAI-shaped error naming Message and a Retry-After header.
type Refusal struct {
	Status  int    // HTTP status: 503 (unavailable)
	Code    string // CodeModelFailed, CodeModelDraining
	Message string // e.g. "failed: health check failed: connection refused (3 of 3 attempts)"
	// RetryAfter is when a retry may be taken, from the learned figures
	// (see Machine.Learn), within [MinRetryAfter, MaxRetryAfter].
	RetryAfter time.Duration
}

// Snapshot is a Machine's state for status, metrics and events. Publish it;
// never gate an action on it (feed an event to the Machine instead).
type Snapshot struct {
	State    State
	Reason   string    // why it is in State; "" when nothing to say
	Since    time.Time // when it entered State
	Attempts int       // failed wake attempts counted toward Budget
	Budget   int       // wake_attempts
	// LastWake is how long the last verified wake took (0 before any).
	LastWake time.Duration
	// RoomWait: Waking, but the wake waits for GPU memory other models
	// hold (WaitingForRoom) and has not started.
	RoomWait bool
	// Yielding: draining for a Demand sleep. Requests arriving are queued
	// for the wake after it, and the drain waits only for the requests in
	// flight.
	Yielding bool
	// AwakeSince is when the model last became verified awake (a wake, or
	// an engine found serving at start); zero before.
	AwakeSince time.Time
}

// IdleSince is when the model was last in use, given its lease evidence:
// the later of its last lease's end and its last verified wake (a wake
// counts as use, so a model just woken is not idle since long before). It
// is the one definition of "idle since": the machine's idle minimum, the
// planner's idle timeout and napctl status all read it. While a lease is
// live, it is the last time the model was idle and means nothing on its own.
func (s Snapshot) IdleSince(leases lease.Evidence) time.Time {
	return later(leases.Since, s.AwakeSince)
}
