// Package model is one configured model's owner loop: the goroutine that
// owns the model's lifecycle machine, its lease admission (slots and the
// queue: by arrival, or round-robin by client under fair_share), its link
// to the engine and the engine operations in flight.
//
// Everything the loop owns is unexported and reached only by the methods of
// *Model, which post a closure to the loop and, where they return a
// result, wait for it: code outside this package cannot touch a loop-owned
// field, so the compiler keeps the ownership rule. What the rest of napd may
// read without the loop is the published Snapshot, which is for status,
// metrics and the planner's input, never for gating an action.
//
// What the loop needs from the rest of napd comes in Deps: the lease
// tracker, the supervisor, the metrics, the event sink, the clock and the
// planner's make-room call. It does not know the registry of models, the
// agent, the gateway's listeners or the config file.
//
// The loop never blocks: supervisor calls (wake, sleep, stop) run on
// goroutines of their own, serialised per model by opMu, and report back by
// posting to the loop with the lifecycle Op they were started for, so a
// late result of an abandoned operation is recognised and ignored.
package model

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// Supervisor is what the loop asks of the engine supervisor
// (*supervisor.Supervisor in napd, a fake in tests). Calls for one model
// are serialised by the loop.
type Supervisor interface {
	// WakeVerified makes the engine awake and verified ready; a nil
	// verify is the HTTP health poll.
	WakeVerified(ctx context.Context, spec supervisor.Spec, verify supervisor.Verify) error
	// Sleep puts the engine to sleep with the named strategy.
	Sleep(ctx context.Context, spec supervisor.Spec, strategy string) error
	// Observe finds out what the engine is doing (reconciliation).
	Observe(ctx context.Context, spec supervisor.Spec) (supervisor.Observation, error)
	// UnitName is the systemd unit running the engine, "" for backends
	// without units.
	UnitName(spec supervisor.Spec) string
}

// Deps is everything a model's loop uses from the rest of napd.
type Deps struct {
	Tracker    *lease.Tracker
	Supervisor Supervisor
	Metrics    *metrics.Metrics
	// Emit receives the model's events (state, wake, sleep). It must not
	// block: the loop calls it.
	Emit func(control.Event)
	// StatusChanged is told after each state change (systemd's STATUS=
	// line). It must not block.
	StatusChanged func()
	// Clock is napd's clock: every time the loop hands the lifecycle
	// machine or the tracker comes from it.
	Clock func() time.Time
	// MakeRoom is the planner's fit-before-wake: it returns once the model
	// fits in GPU memory, with the GPUs chosen for it (gpus = "any" or
	// { count = N }; nil for a fixed list); or a *gateway.Refusal when room can never appear
	// in time, or another error when the wake is not to go ahead (its
	// requests left), or ctx's error. While the model waits for room,
	// waiting is told what for (the holders), on changes only. It runs on
	// the wake's goroutine, never on the loop, and returns when ctx ends.
	MakeRoom func(ctx context.Context, model string, waiting func(holders string)) ([]int, error)
	// GPUDevices are napd's GPU indexes as the vendors' runtimes know
	// them, from the last GPU reading (nil when it lacks one of them: the
	// indexes are then taken for NVIDIA's). nil: never resolved.
	GPUDevices func(gpus []int) []supervisor.GPU
	// WaitingFor names the holders of the GPU memory the model's wake
	// waits for, "" when it does not wait (for a 504's message).
	WaitingFor func(model string) string
	// Idle is told when the model's last lease ended: a model waiting for
	// its memory may now have it put to sleep. It must not block.
	Idle func()
	// Probe is one health probe of an awake HTTP engine and a reading of
	// its progress (see Watch); nil: awake engines are not probed. It runs
	// off the loop, within ctx.
	Probe func(ctx context.Context, spec supervisor.Spec, cfg *config.Model) ProbeResult
	// Overflow hands a request the model cannot serve in time to the
	// first of targets (remote models) that can take it, moving its lease
	// id there (lease.Tracker.Move): the target's ticket, with Moved.Idle
	// when the model's last lease moved; ErrNoOverflow when none could
	// (nothing moved); any other error ended the request there. nil: no
	// overflow. It runs on the request's goroutine and returns when ctx
	// ends.
	Overflow func(ctx context.Context, targets []string, id lease.ID) (*gateway.Ticket, lease.Moved, error)
	Log      *slog.Logger
	// Ctx is napd's lifetime: engine operations in flight end with it.
	Ctx context.Context
	// Usage accounts who used the box; nil: nobody does.
	Usage Usage
	// Load measures a waking engine's load; nil: it is not measured.
	Load LoadMeter
}

// Usage is napd's accounting of GPU time per key (*usage.Ledger in
// napd): told when a granted request starts and stops holding the
// engine's memory, and which key's request caused a wake, and a wake that
// had to wait for others to give memory back (a swap). The loop calls
// it: its methods must not block.
type Usage interface {
	Begin(now time.Time, model, key string)
	End(now time.Time, model, key string)
	Woke(now time.Time, model, key string)
	Swapped(now time.Time, model, key string)
}

// Model is one configured model and its owner loop.
type Model struct {
	name string
	d    Deps
	log  *slog.Logger
	msgs chan func()
	stop chan struct{} // closed (once, by Shutdown) to end the loop
	quit chan struct{} // closed when the loop has ended
	once sync.Once
	// loading: a router API load (Load) is under way.
	loading atomic.Bool
	// opMu serialises the supervisor calls for this model: a wake the
	// machine gave up on may still be finishing (or cleaning up) when the
	// next attempt starts.
	opMu sync.Mutex
	snap atomic.Pointer[published]
	// mu is held by whoever runs the loop's code: the loop goroutine for
	// what is posted to it, and a request's own goroutine for its arrival
	// and end, so admitting a request to an awake model costs no hand-off
	// to the loop and back (docs/bench.md). ended: the loop has ended.
	mu    sync.Mutex
	ended bool
	// posted counts what was posted to the loop and has not run yet: a
	// caller runs inline only when nothing posted before waits, so what
	// one goroutine posts and then runs inline runs in that order.
	posted atomic.Int64

	// ---- owned by the loop (held under mu) ----
	cfg      *config.Model
	spec     supervisor.Spec // the configured engine: the next wake starts this one (a change drops base)
	eng      *instance       // the engine the last wake started (or the one found at start)
	nextLink Link            // a reload's new link, used once the engine restarts
	machine  *lifecycle.Machine
	active   int       // granted requests (slots in use)
	queue    []*waiter // waiting for a wake or a slot, in arrival order
	turn     string    // the client granted last (fair_share's round-robin)
	// activeBy counts the granted requests by class; recent is the
	// highest class of the last busy period (from a grant while none was
	// in flight to the next time none is), for eviction order.
	activeBy [priority.MaxClasses + 1]int
	recent   priority.Class
	// wakeCause is the key whose request started the wake in flight.
	wakeCause string
	wakeStop  context.CancelFunc
	wakeOp    lifecycle.Op
	wokeAt    time.Time          // start of the current wake: older engine exits are not its
	lastUsed  time.Time          // end of the last lease, for LRU
	retiring  bool               // removed by a reload: stop once the leases end
	restart   bool               // spec changed by a reload: restart once idle
	stopping  bool               // the engine is being stopped for a reload
	stale     bool               // the engine may run but does not answer: stop it before the next wake
	clearing  bool               // the wake in flight is stopping such an engine first: its exit is not news
	seen      lifecycle.Snapshot // the state last announced
	sleepers  []chan error       // operator sleeps waiting for their outcome
	wakes     planner.Recent     // durations of the recent verified wakes
	tails     planner.Recent     // of those, the time from their last weight byte read to serving
	requests  planner.Recent     // durations of the recent granted requests
	typical   planner.Learned    // the typical of wakes and requests, as learn found it
	base      *Snapshot          // the shared part of the snapshot published last
	watch     *lifecycle.Watch   // health probes of the awake engine
	watched   *instance          // the engine the watch is about
	probing   bool               // a probe is in flight
	progress  Progress           // the reading of the last probe
	slept     string             // the strategy the engine sleeps with ("" = awake or unknown)
	freed     time.Time          // when the engine last gave its GPU memory back: a sleep, a stop, an exit
	deeper    bool               // a move down the sleep ladder is in flight
	roomBy    time.Time          // when the desk expects the room the wake waits for (RoomExpected); zero: unknown
	// load is the load of the wake in flight as measured (nil: not
	// measured, or not started), of an engine started with loadSpec;
	// loadReading: a reading of it is in flight.
	load        *loadprogress.Load
	loadSpec    supervisor.Spec
	loadReading bool
}

// instance is one engine as requests reach it: the spec it was started
// with, its root URL, the link to it and its own connections. Granted
// requests hold the instance; an engine restart replaces it, never changes
// it under them, and retires the old one.
type instance struct {
	spec   supervisor.Spec
	target *url.URL
	link   Link
	tr     http.RoundTripper
	gone   atomic.Bool // retired: it exited, slept or was replaced
}

func newInstance(spec supervisor.Spec, link Link) *instance {
	i := &instance{spec: spec, target: targetOf(spec), link: link}
	i.tr = link.Transport(i.gone.Load)
	return i
}

// retire ends the instance for requests: those granted to it that have not
// connected yet are refused (and rerouted to the next instance by the
// gateway), idle connections are dropped. Requests under way finish, or
// fail, on their own connections.
func (i *instance) retire() {
	i.gone.Store(true)
	i.closeIdle()
}

// closeIdle closes the idle connections of the instance's transport.
func (i *instance) closeIdle() {
	if t, ok := i.tr.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
}

// replaceEngine makes next the instance requests are granted to.
func (m *Model) replaceEngine(next *instance) {
	if m.eng != next {
		m.eng.retire()
	}
	m.eng = next
}

// Snapshot is a model's published state.
type Snapshot struct {
	Config     *config.Model
	Spec       supervisor.Spec
	Lifecycle  lifecycle.Snapshot
	QueueDepth int
	Active     int       // granted requests
	LastUsed   time.Time // end of the last lease (or the model's creation)
	// Oldest and Deadline are the arrival and the deadline of the request
	// queued longest (zero when none): its wake's turn for GPU memory.
	Oldest, Deadline time.Time
	// Queued is, by class, the arrival of the oldest queued request of
	// each (nil when none is queued): the wake's class in its turn.
	// Serving is the highest class among the requests in flight (None:
	// none), Recent the highest of the last busy period.
	Queued          *priority.Oldest
	Serving, Recent priority.Class
	// Learned is the typical duration of the model's recent wakes and
	// requests.
	Learned planner.Learned
	// Slept is the strategy the sleeping engine sleeps with, "" when awake
	// or unknown (found asleep at start): the level of the sleep ladder
	// reached.
	Slept string
	// Freed is when the engine last gave its GPU memory back (a sleep, a
	// stop, an exit; zero before any): a GPU reading from about then may
	// still show that memory, held by a process napd no longer knows.
	Freed time.Time
	// Load is the progress of the load while the model wakes, as of its
	// last reading; nil when not measured.
	Load *loadprogress.Status
}

// New returns the model for cfg, whose engine is started with spec. Its
// loop runs once Run is called. The lifecycle starts Unverified: call
// Observe to reconcile it with what the supervisor finds.
func New(d Deps, cfg *config.Model, spec supervisor.Spec) *Model {
	m := &Model{
		name: cfg.Name,
		d:    d,
		log:  d.Log.With("model", cfg.Name),
		msgs: make(chan func(), 64),
		stop: make(chan struct{}),
		quit: make(chan struct{}),
		cfg:  cfg,
		spec: spec,
	}
	now := m.now()
	m.eng = newInstance(spec, m.newLink(cfg))
	m.machine = lifecycle.New(now, PolicyOf(cfg))
	m.watch = newWatch(cfg)
	m.lastUsed = now
	d.Tracker.Register(cfg.Name, now)
	m.publish()
	return m
}

// targetOf is the root URL of the engine started with spec. Granted
// requests hold the pointer: it is replaced, never changed.
func targetOf(spec supervisor.Spec) *url.URL {
	return &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(spec.Port)}
}

// PolicyOf maps a model's config onto the lifecycle's policy. The idle
// minimum (anti-flap) is half the idle timeout, at most one minute: a model
// woken for a request is not a candidate for pressure eviction until it was
// idle that long, and pressure can still take it before its idle timeout.
func PolicyOf(c *config.Model) lifecycle.Policy {
	idleMin := time.Minute
	if c.IdleTimeout > 0 && c.IdleTimeout/2 < idleMin {
		idleMin = c.IdleTimeout / 2
	}
	return lifecycle.Policy{
		DrainTimeout:         c.DrainTimeout,
		WakeTimeout:          c.WakeTimeout,
		WakeAttempts:         c.WakeAttempts,
		ArrivalWhileDraining: c.ArrivalWhileDraining,
		AllowUntrackedUnload: c.AllowUntrackedUnload,
		IdleMinimum:          idleMin,
	}
}

// Name is the model's configured name.
func (m *Model) Name() string { return m.name }

// Snapshot is the model's last published state.
func (m *Model) Snapshot() Snapshot { return m.snap.Load().snapshot() }

// QueueDepth is Snapshot().QueueDepth without the copy of the rest (each
// answer's X-Queue-Depth reads it).
func (m *Model) QueueDepth() int { return m.snap.Load().queueDepth }

// Run is the owner loop; it returns after Shutdown, having closed the
// engine links.
func (m *Model) Run() {
	defer close(m.quit)
	defer m.closeLinks()
	for {
		select {
		case f := <-m.msgs:
			m.mu.Lock()
			f()
			m.posted.Add(-1)
			m.mu.Unlock()
		case <-m.stop:
			m.mu.Lock()
			m.ended = true
			m.mu.Unlock()
			return
		}
	}
}

// Shutdown ends the loop. Later calls are refused; goroutines still
// reporting (a wake in flight) find the loop gone and give up.
func (m *Model) Shutdown() { m.once.Do(func() { close(m.stop) }) }

// Done is closed once the loop has ended.
func (m *Model) Done() <-chan struct{} { return m.quit }

// do runs f on the owner loop. It returns false when the loop has ended;
// f may also be left unrun when the loop ends right after it was posted,
// so whoever waits for f's effect also watches quit.
func (m *Model) do(f func()) bool {
	select {
	case <-m.quit:
		return false
	default:
	}
	m.posted.Add(1)
	select {
	case m.msgs <- f:
		return true
	case <-m.quit:
		m.posted.Add(-1)
		return false
	}
}

// inline runs f as the owner loop would, on the caller's goroutine under
// the loop's lock, when nothing posted before waits to run (else it posts
// f, as do): for a request's own arrival and end, which then need not
// wait for the loop's goroutine to be scheduled. f must not wait for the
// loop (the loop's own code never does). It returns false when the loop
// has ended.
func (m *Model) inline(f func()) bool {
	return m.inlineFor(nil, func(*waiter) { f() })
}

// inlineFor is inline for f(w), f a plain function, so that a request's
// arrival and end on the fast path allocate no closure. w, when not nil,
// is readied for an answer from the loop's goroutine before the lock is
// let go: f may have queued it, or is posted to run later.
func (m *Model) inlineFor(w *waiter, f func(*waiter)) bool {
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return false
	}
	if m.posted.Load() == 0 {
		f(w)
		if w != nil && !w.answered {
			w.waits()
		}
		m.mu.Unlock()
		return true
	}
	if w != nil && !w.answered {
		w.waits()
	}
	m.mu.Unlock()
	return m.do(func() { f(w) })
}

// call runs f on the owner loop and waits for it.
func (m *Model) call(f func()) bool {
	done := make(chan struct{})
	if !m.do(func() { f(); close(done) }) {
		return false
	}
	select {
	case <-done:
		return true
	case <-m.quit:
		return false
	}
}

// Ping returns once the loop has answered, or has ended; it fails when ctx
// ends first (a wedged loop: the watchdog stops pinging systemd).
func (m *Model) Ping(ctx context.Context) error {
	done := make(chan struct{})
	m.posted.Add(1)
	select {
	case m.msgs <- func() { close(done) }:
	case <-m.quit:
		m.posted.Add(-1)
		return nil
	case <-ctx.Done():
		m.posted.Add(-1)
		return ctx.Err()
	}
	select {
	case <-done:
	case <-m.quit:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (m *Model) now() time.Time { return m.d.Clock() }

func (m *Model) evidence() lease.Evidence {
	ev, _ := m.d.Tracker.Evidence(m.name)
	return ev
}

// drainEvidence is the lease evidence a drain waits on: a yielding model's
// queued requests hold leases but wait for the wake after its sleep, so
// only the requests in flight count.
func (m *Model) drainEvidence() lease.Evidence {
	ev := m.evidence()
	if m.machine.Snapshot().Yielding {
		ev.Active = m.active
	}
	return ev
}

// closeLinks ends the engine links when the loop ends.
func (m *Model) closeLinks() {
	m.eng.retire()
	m.eng.link.Close()
	if m.nextLink != nil {
		m.nextLink.Close()
	}
}

// ---- events from elsewhere ----

// Tick has the loop check the machine's deadlines (drain, wake) and
// probe an awake engine's health when due.
func (m *Model) Tick() {
	m.do(func() {
		m.apply(m.machine.Tick(m.now(), m.drainEvidence()), nil)
		m.watchTick()
		m.loadTick()
		m.releaseLate()
		m.publish()
	})
}

// EngineExited reports an engine exit napd did not ask for; at dates the
// engine instance that exited (its exit, or its session's start).
func (m *Model) EngineExited(reason string, at time.Time) {
	m.do(func() { m.engineExited(reason, at) })
}

// RequestSleep asks the lifecycle for an automatic sleep (the planner's)
// with what the engine's evidence says (Engine, Detail, ActiveAt; the loop
// adds its fresh lease evidence); the machine has the last word. It does
// not wait.
func (m *Model) RequestSleep(req lifecycle.SleepRequest, engine lifecycle.Evidence) {
	m.do(func() { m.requestSleep(req, engine) })
}

// CancelYield takes back a yield nobody waits for any more: the model
// serves the requests queued behind it.
func (m *Model) CancelYield() {
	m.do(func() {
		m.apply(m.machine.CancelYield(m.now()), nil)
		m.publish()
	})
}

// Reset is the operator's reset of a failed model.
func (m *Model) Reset() {
	m.call(func() {
		m.machine.Reset(m.now())
		m.noteState()
		m.publish()
	})
}

// engineExited handles an engine exit on the loop. An instance older than
// the current wake is old news and must not fail it: a worker's dead
// session and its process exit arrive separately.
func (m *Model) engineExited(reason string, at time.Time) {
	if m.exitIsStale(at) {
		m.log.Debug("engine exit from before this wake ignored", "reason", reason)
		return
	}
	m.eng.retire()
	m.freed = m.now()
	m.apply(m.machine.EngineExited(m.now(), reason, m.evidence()), nil)
	m.publish()
}

// exitIsStale reports a notice about an engine instance from before the
// wake in flight (the process's own exit event may have started it), or
// about the unanswering engine that wake stops before it starts the next.
func (m *Model) exitIsStale(at time.Time) bool {
	return m.machine.Snapshot().State == lifecycle.Waking && (m.clearing || at.Before(m.wokeAt))
}

// requestSleep asks the machine for a sleep (planner or operator) on the
// engine's evidence and the model's fresh lease evidence.
func (m *Model) requestSleep(req lifecycle.SleepRequest, engine lifecycle.Evidence) lifecycle.Decision {
	engine.Leases = m.evidence()
	d := m.machine.RequestSleep(m.now(), req, engine)
	m.apply(d, nil)
	m.publish()
	return d
}

// learned is the typical duration of the model's recent wakes and requests.
func (m *Model) learned() planner.Learned { return m.typical }

// learn works out the typical durations again and hands them to the
// machine, for its refusals' Retry-After; call it after each wake or
// request is measured.
func (m *Model) learn() {
	m.typical = planner.Learned{Wake: m.wakes.Typical(), Request: m.requests.Typical()}
	m.machine.Learn(m.typical.Wake, m.typical.Request)
}

// ---- publishing ----

// published is a Snapshot as stored. What changes with every request is
// its own; the rest (config, spec, lifecycle, sleep) is in base, shared by
// the snapshots published while it stays the same. Neither is changed once
// stored: a reader may still be copying it.
type published struct {
	base             *Snapshot // only Config, Spec, Lifecycle, Slept and Freed set
	queueDepth       int
	active           int
	lastUsed         time.Time
	oldest, deadline time.Time
	learned          planner.Learned
	queued           *priority.Oldest
	serving, recent  priority.Class
	load             *loadprogress.Status
}

func (p *published) snapshot() Snapshot {
	s := *p.base
	s.QueueDepth, s.Active, s.LastUsed = p.queueDepth, p.active, p.lastUsed
	s.Oldest, s.Deadline, s.Learned = p.oldest, p.deadline, p.learned
	s.Queued, s.Serving, s.Recent = p.queued, p.serving, p.recent
	s.Load = p.load
	return s
}

func (m *Model) publish() {
	lc := m.machine.Snapshot()
	b := m.base
	if b == nil || b.Config != m.cfg || b.Lifecycle != lc || b.Slept != m.slept || b.Freed != m.freed {
		b = &Snapshot{Config: m.cfg, Spec: m.spec, Lifecycle: lc, Slept: m.slept, Freed: m.freed}
		m.base = b
	}
	p := &published{base: b, queueDepth: len(m.queue), active: m.active, lastUsed: m.lastUsed, learned: m.learned(),
		serving: m.serving(), recent: m.recent, load: m.loadStatus()}
	if len(m.queue) > 0 {
		p.oldest, p.deadline = m.queue[0].arrived, m.queue[0].deadline
		p.queued = new(priority.Oldest)
		for _, w := range m.queue {
			p.queued.Note(w.class, w.arrived)
		}
	}
	m.snap.Store(p)
}

// noteState announces a state change (log, event, STATUS) once, and
// answers the operator sleeps a drain that ended without a sleep leaves.
func (m *Model) noteState() {
	after := m.machine.Snapshot()
	if after.State != lifecycle.Draining && len(m.sleepers) > 0 {
		var err error
		if after.State != lifecycle.Sleeping {
			err = fmt.Errorf("sleep %s: %s", m.name, after.Reason)
		}
		m.answerSleepers(err)
	}
	if after.State == m.seen.State && after.Reason == m.seen.Reason {
		return
	}
	before := m.seen
	m.seen = after
	from := ""
	if before.State != 0 {
		from = before.State.String()
	}
	attrs := []any{"from", from, "state", after.State.String(), "reason", after.Reason}
	if unit := m.d.Supervisor.UnitName(m.spec); unit != "" {
		attrs = append(attrs, "unit", unit)
	}
	m.log.Info("state changed", attrs...)
	// Published first: whoever the event wakes reads the new state.
	m.publish()
	m.emit(control.Event{Kind: control.EventState, From: from, To: after.State.String(), Reason: after.Reason})
	if m.d.StatusChanged != nil {
		m.d.StatusChanged()
	}
}

func (m *Model) emit(e control.Event) {
	e.Time = time.Now()
	e.Model = m.name
	if m.d.Emit != nil {
		m.d.Emit(e)
	}
}

// removed is the refusal for a request that reached a model a reload
// removed: 503, as the request raced the reload (a later one gets 404).
// The model is gone once its requests in flight end, so a retry after a
// typical request finds out for good (or finds the model re-added). It
// reads the published snapshot: it runs on and off the loop.
func (m *Model) removed() *gateway.Refusal {
	return &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: "model_removed",
		Message:    "model " + m.name + " was removed from the configuration",
		RetryAfter: max(m.Snapshot().Learned.Request, lifecycle.MinRetryAfter)}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
