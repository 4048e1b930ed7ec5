package agent

import (
	"context"
	"errors"
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
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// model is one configured model and its owner loop. Every field below the
// line is owned by the loop goroutine: other goroutines reach it only by
// sending a closure through do. What others may read is the published
// snapshot (atomic), never used to gate an action.
type model struct {
	name string
	a    *Agent
	log  *slog.Logger
	msgs chan func()
	stop chan struct{} // closed (once, by shutdown) to end the loop
	quit chan struct{} // closed when the loop has ended
	once sync.Once
	// opMu serialises the supervisor calls for this model: a wake the
	// machine gave up on may still be finishing (or cleaning up) when the
	// next attempt starts.
	opMu sync.Mutex
	snap atomic.Pointer[modelSnap]

	// ---- owned by the loop ----
	cfg      *config.Model
	spec     supervisor.Spec
	oldSpec  supervisor.Spec // the spec the running engine was started with
	target   *url.URL        // the running engine's root (from oldSpec)
	tr       http.RoundTripper
	nextTr   http.RoundTripper // a reload's new transport, used once the engine restarts
	machine  *lifecycle.Machine
	active   int       // granted requests (slots in use)
	queue    []*waiter // FIFO: waiting for a wake or a slot
	wakeStop context.CancelFunc
	wakeOp   lifecycle.Op
	wokeAt   time.Time          // start of the current wake: older engine exits are not its
	lastUsed time.Time          // end of the last lease, for LRU
	retiring bool               // removed by a reload: stop once the leases end
	restart  bool               // spec changed by a reload: restart once idle
	stopping bool               // the engine is being stopped for a reload
	stale    bool               // the engine may run but does not answer: stop it before the next wake
	seen     lifecycle.Snapshot // the state last announced
}

// modelSnap is a model's published state.
type modelSnap struct {
	cfg        *config.Model
	spec       supervisor.Spec
	lc         lifecycle.Snapshot
	queueDepth int
	active     int
	lastUsed   time.Time
}

// waiter is one admitted-lease request waiting for a grant.
type waiter struct {
	id      lease.ID
	arrived time.Time
	reply   chan grant // buffered 1: the loop never blocks on it
	granted bool
	woke    bool // it waited for a wake
}

type grant struct {
	err      error
	target   *url.URL
	tr       http.RoundTripper
	wakeWait time.Duration
}

func newModel(a *Agent, cfg *config.Model, spec supervisor.Spec, tr http.RoundTripper, now time.Time) *model {
	m := &model{
		name:    cfg.Name,
		a:       a,
		log:     a.log.With("model", cfg.Name),
		msgs:    make(chan func(), 64),
		stop:    make(chan struct{}),
		quit:    make(chan struct{}),
		cfg:     cfg,
		spec:    spec,
		oldSpec: spec,
		tr:      tr,
		target:  targetOf(spec),
		machine: lifecycle.New(now, policyOf(cfg)),
	}
	m.lastUsed = now
	m.publish()
	return m
}

// targetOf is the root URL of the engine started with spec. Granted
// requests hold the pointer: it is replaced, never changed.
func targetOf(spec supervisor.Spec) *url.URL {
	return &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(spec.Port)}
}

// policyOf maps a model's config onto the lifecycle's policy. The idle
// minimum (anti-flap) is half the idle timeout, at most one minute: a model
// woken for a request is not a candidate for pressure eviction until it was
// idle that long, and pressure can still take it before its idle timeout.
func policyOf(c *config.Model) lifecycle.Policy {
	idleMin := time.Minute
	if c.IdleTimeout > 0 && c.IdleTimeout/2 < idleMin {
		idleMin = c.IdleTimeout / 2
	}
	return lifecycle.Policy{
		DrainTimeout:         c.DrainTimeout,
		WakeTimeout:          c.WakeTimeout,
		WakeAttempts:         c.WakeAttempts,
		ArrivalWhileDraining: lifecycle.ArrivalPolicy(c.ArrivalWhileDraining),
		AllowUntrackedUnload: c.AllowUntrackedUnload,
		IdleMinimum:          idleMin,
	}
}

// run is the owner loop.
func (m *model) run() {
	defer close(m.quit)
	for {
		select {
		case f := <-m.msgs:
			f()
		case <-m.stop:
			return
		}
	}
}

// shutdown ends the loop. Later do calls return false; goroutines still
// reporting (a wake in flight) find the loop gone and give up.
func (m *model) shutdown() { m.once.Do(func() { close(m.stop) }) }

// do runs f on the owner loop. It returns false when the loop has ended.
func (m *model) do(f func()) bool {
	select {
	case m.msgs <- f:
		return true
	case <-m.quit:
		return false
	}
}

// call runs f on the owner loop and waits for it.
func (m *model) call(f func()) bool {
	done := make(chan struct{})
	if !m.do(func() { f(); close(done) }) {
		return false
	}
	<-done
	return true
}

func (m *model) now() time.Time { return m.a.clock() }

func (m *model) evidence() lease.Evidence {
	ev, _ := m.a.tracker.Evidence(m.name)
	return ev
}

// ---- requests (called from gateway goroutines) ----

// admit takes a lease and waits for a slot; see gateway.Models.Admit.
func (m *model) admit(ctx context.Context, a gateway.Admission) (*gateway.Ticket, error) {
	req := lease.Request{Model: m.name, Client: a.Client, Kind: a.Kind, Stream: a.Stream, Key: a.IdempotencyKey, Fingerprint: a.Fingerprint}
	var adm lease.Admission
	for {
		var err error
		adm, err = m.a.tracker.Begin(m.now(), req)
		if err != nil {
			return nil, err
		}
		if adm.Verdict == lease.Conflict {
			return nil, keyReused()
		}
		if adm.Verdict == lease.Replayed {
			return &gateway.Ticket{Replay: storedToGateway(adm.Response), Done: func(gateway.Outcome) {}}, nil
		}
		if adm.Verdict == lease.Started {
			break
		}
		select { // Joined: wait for the first request, then ask again
		case <-adm.Wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	w := &waiter{id: adm.ID, arrived: m.now(), reply: make(chan grant, 1)}
	if !m.do(func() { m.arrive(w) }) {
		m.end(w, gateway.Outcome{Cancelled: true})
		return nil, m.removed()
	}
	select {
	case g := <-w.reply:
		if g.err != nil {
			m.end(w, gateway.Outcome{Cancelled: true})
			return nil, g.err
		}
		t := &gateway.Ticket{Target: g.target, Transport: g.tr, WakeWait: g.wakeWait}
		var once atomic.Bool
		t.Done = func(o gateway.Outcome) {
			if once.CompareAndSwap(false, true) {
				m.end(w, o)
			}
		}
		return t, nil
	case <-ctx.Done():
		// The loop may have granted it meanwhile: withdraw settles either way.
		m.do(func() { m.withdraw(w) })
		m.end(w, gateway.Outcome{Cancelled: true})
		return nil, ctx.Err()
	}
}

// end releases w's lease and, on the loop, its slot.
func (m *model) end(w *waiter, o gateway.Outcome) {
	out := lease.Outcome{Cancelled: o.Cancelled}
	if o.Response != nil {
		out.Response = &lease.Stored{Status: o.Response.Status, Header: o.Response.Header, Body: o.Response.Body}
	}
	now := m.now()
	ended, _ := m.a.tracker.End(now, w.id, out)
	m.do(func() {
		if w.granted {
			w.granted = false
			m.active--
		}
		m.lastUsed = now
		if ended.Idle {
			m.apply(m.machine.LastLeaseEnded(m.now(), m.evidence()), nil)
		}
		m.dispatch()
		m.afterIdle()
		m.publish()
	})
}

// removed is the refusal for a request that reached a model a reload
// removed: 503, as the request raced the reload (a later one gets 404).
func (m *model) removed() *gateway.Refusal {
	return &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: "model_removed",
		Message: "model " + m.name + " was removed from the configuration", RetryAfter: time.Second}
}

// keyReused refuses an Idempotency-Key used before for another request.
func keyReused() *gateway.Refusal {
	return &gateway.Refusal{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was used for another request (method, path, model or body differ)"}
}

func storedToGateway(s *lease.Stored) *gateway.StoredResponse {
	if s == nil {
		return nil
	}
	return &gateway.StoredResponse{Status: s.Status, Header: s.Header, Body: s.Body}
}

// ---- the loop's handlers ----

func (m *model) arrive(w *waiter) {
	if m.retiring {
		w.reply <- grant{err: m.removed()}
		return
	}
	if m.stopping { // the old engine is being stopped: wake the new one after
		m.enqueue(w, true)
		m.publish()
		return
	}
	m.apply(m.machine.Arrive(m.now()), w)
	m.publish()
}

// withdraw handles a waiter whose client left or whose deadline ran out.
func (m *model) withdraw(w *waiter) {
	for i, q := range m.queue {
		if q == w {
			m.queue = append(m.queue[:i], m.queue[i+1:]...)
			break
		}
	}
	m.publish()
}

// apply performs a lifecycle decision. w is the arriving request, if the
// event was an arrival.
func (m *model) apply(d lifecycle.Decision, w *waiter) {
	if d.Cancel != 0 && d.Cancel == m.wakeOp && m.wakeStop != nil {
		m.wakeStop() // the machine gave up on this wake; its late result is ignored
		m.wakeStop = nil
	}
	switch d.Action {
	case lifecycle.Admit:
		m.enqueue(w, false)
	case lifecycle.QueueForWake:
		m.enqueue(w, true)
	case lifecycle.StartWake:
		if w != nil {
			m.enqueue(w, true)
		}
		m.startWake(d.Op, d.Attempt)
	case lifecycle.Refuse:
		if w != nil {
			w.reply <- grant{err: refusal(d.Refusal)}
		}
	case lifecycle.AdmitWaiting:
		m.a.metrics.Wakes.WithLabelValues(m.name, "ok").Inc()
		lc := m.machine.Snapshot()
		m.a.metrics.WakeTime.WithLabelValues(m.name).Observe(lc.LastWake.Seconds())
		m.emit(control.Event{Kind: "wake", Reason: d.Reason, WakeMs: lc.LastWake.Milliseconds()})
		m.dispatch()
	case lifecycle.RefuseWaiting:
		for _, q := range m.queue {
			q.reply <- grant{err: refusal(d.Refusal)}
		}
		m.queue = nil
	case lifecycle.IssueSleep:
		m.startSleep(d.Op, d.Sleep)
	case lifecycle.AbandonDrain:
		m.log.Warn("drain abandoned", "reason", d.Reason)
		m.dispatch()
	case lifecycle.Declined:
		m.log.Debug("sleep declined", "reason", d.Reason)
	}
	m.noteState()
}

// noteState announces a state change (log, event, STATUS) once.
func (m *model) noteState() {
	after := m.machine.Snapshot()
	if after.State == m.seen.State && after.Reason == m.seen.Reason {
		return
	}
	before := m.seen
	m.seen = after
	m.stateChanged(before, after)
}

// enqueue admits w now when the model serves and a slot is free, else
// queues it in FIFO order. Requests waiting for a wake may use the slots
// the wake will open plus the queue; a full queue is refused with 503.
func (m *model) enqueue(w *waiter, forWake bool) {
	if w == nil {
		return
	}
	w.woke = forWake || w.woke
	limit := m.cfg.Queue
	if forWake {
		limit += m.cfg.MaxConcurrency
	}
	if !forWake && len(m.queue) == 0 && m.active < m.cfg.MaxConcurrency {
		m.grant(w)
		return
	}
	if len(m.queue) >= limit {
		w.reply <- grant{err: &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: "queue_full",
			Message:    fmt.Sprintf("model %s: queue full (%d waiting, %d in flight)", m.name, len(m.queue), m.active),
			RetryAfter: time.Second}}
		return
	}
	m.queue = append(m.queue, w)
}

// dispatch grants queued requests while the model serves and slots are free.
func (m *model) dispatch() {
	if !m.machine.Snapshot().State.Serving() {
		return
	}
	for len(m.queue) > 0 && m.active < m.cfg.MaxConcurrency {
		w := m.queue[0]
		m.queue = m.queue[1:]
		m.grant(w)
	}
}

func (m *model) grant(w *waiter) {
	w.granted = true
	m.active++
	g := grant{target: m.target, tr: m.tr}
	if w.woke {
		g.wakeWait = m.now().Sub(w.arrived)
	}
	w.reply <- g
}

func refusal(r *lifecycle.Refusal) *gateway.Refusal {
	return &gateway.Refusal{Status: r.Status, Code: r.Code, Message: r.Message, RetryAfter: r.RetryAfter}
}

// startWake runs one wake attempt off the loop and reports back with op.
func (m *model) startWake(op lifecycle.Op, attempt int) {
	ctx, cancel := context.WithTimeout(m.a.ctx, m.cfg.WakeTimeout)
	m.wakeStop, m.wakeOp = cancel, op
	m.wokeAt = m.now()
	spec := m.spec
	verify := verifyOf(m.tr)
	stale := m.stale
	m.stale = false
	m.log.Info("waking", "attempt", attempt, "of", m.cfg.WakeAttempts)
	go func() {
		defer cancel()
		m.opMu.Lock()
		err := m.a.makeRoom(ctx, m.name)
		var noRoom *gateway.Refusal
		if errors.As(err, &noRoom) {
			m.opMu.Unlock()
			m.do(func() { m.noRoom(op, noRoom) })
			return
		}
		if err == nil && stale {
			m.log.Info("stopping an engine that stopped answering, before waking it")
			m.stopEngine(spec)
		}
		if err == nil {
			err = m.a.sup.WakeVerified(ctx, spec, verify)
		}
		if err != nil {
			m.a.metrics.Wakes.WithLabelValues(m.name, wakeResult(err)).Inc()
			var exit *supervisor.ExitError
			if !errors.As(err, &exit) {
				// A failed attempt leaves the engine in an unknown state
				// (hung, half loaded, still asleep): the next one starts
				// from a stopped engine.
				m.stopEngine(spec)
			}
		}
		m.opMu.Unlock()
		m.do(func() {
			if op == m.wakeOp {
				m.wakeStop = nil
			}
			if err == nil {
				m.oldSpec, m.target = spec, targetOf(spec)
			}
			m.apply(m.machine.WakeDone(m.now(), op, err, m.evidence()), nil)
			m.publish()
		})
	}()
}

// stopEngine stops the engine outside the lifecycle's sleeps: after a
// failed wake, or before waking an engine that stopped answering. The
// caller holds opMu.
func (m *model) stopEngine(spec supervisor.Spec) {
	ctx, cancel := context.WithTimeout(m.a.ctx, m.cfg.StopTimeout+10*time.Second)
	defer cancel()
	if err := m.a.sup.Sleep(ctx, spec, config.SleepStop); err != nil {
		m.log.Warn("stopping the engine", "err", err)
	}
}

// noRoom handles a wake that cannot fit in GPU memory: not the engine's
// fault, so no attempt is spent; the waiting requests get the 503 that
// names what holds the memory.
func (m *model) noRoom(op lifecycle.Op, r *gateway.Refusal) {
	if op != m.wakeOp || m.wakeStop == nil {
		return // the machine gave up on this wake: its queue belongs to another
	}
	m.wakeStop = nil
	for _, q := range m.queue {
		q.reply <- grant{err: r}
	}
	m.queue = nil
	m.apply(m.machine.WakeAborted(m.now(), op, r.Message), nil)
	m.publish()
}

func wakeResult(err error) string {
	var exit *supervisor.ExitError
	switch {
	case errors.As(err, &exit):
		return "exited"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "unhealthy"
}

// startSleep issues a sleep off the loop and reports back with op.
func (m *model) startSleep(op lifecycle.Op, req lifecycle.SleepRequest) {
	spec := m.oldSpec // the running engine's
	strategy := req.Strategy
	if strategy == "" {
		strategy = m.cfg.Sleep
	}
	m.log.Info("putting to sleep", "strategy", strategy, "reason", req.Reason.String())
	go func() {
		ctx, cancel := context.WithTimeout(m.a.ctx, m.cfg.StopTimeout+m.cfg.DrainTimeout+30*time.Second)
		defer cancel()
		m.opMu.Lock()
		err := m.a.sup.Sleep(ctx, spec, strategy)
		m.opMu.Unlock()
		m.do(func() {
			d := m.machine.SleepDone(m.now(), op, err, m.evidence())
			if err == nil {
				m.a.metrics.Sleeps.WithLabelValues(m.name, sleepLabel(req)).Inc()
				m.emit(control.Event{Kind: "sleep", Reason: req.Reason.String() + ", strategy " + strategy})
			}
			m.apply(d, nil)
			m.afterIdle()
			m.publish()
		})
	}()
}

// sleepLabel is a sleep's reason label: the planner's own (idle,
// gpu-pressure, make-room, …), else an operator's (napctl, or a reload
// restarting the engine).
func sleepLabel(req lifecycle.SleepRequest) string {
	if req.Cause != "" {
		return req.Cause
	}
	return "operator"
}

// afterIdle finishes a reload's pending work once the model is idle: a
// removed model's engine is stopped and its loop ends; a model whose engine
// spec changed has its old engine stopped, so the next request starts the
// new one. A serving model goes through the lifecycle (a drained sleep), so
// no request is cut.
func (m *model) afterIdle() {
	if (!m.retiring && !m.restart) || m.stopping {
		return
	}
	if m.active > 0 || len(m.queue) > 0 || m.evidence().Active > 0 {
		return
	}
	switch st := m.machine.Snapshot().State; {
	case st.Serving():
		m.requestSleep(lifecycle.SleepRequest{Reason: lifecycle.Operator, Strategy: config.SleepStop}, lifecycle.EngineNoEvidence)
		return
	case st == lifecycle.Waking || st == lifecycle.Draining:
		return // its result calls afterIdle again
	}
	m.stopping = true
	spec := m.oldSpec
	go func() {
		m.opMu.Lock()
		m.stopEngine(spec)
		m.opMu.Unlock()
		m.do(func() {
			m.stopping, m.restart = false, false
			m.oldSpec, m.target = m.spec, targetOf(m.spec)
			if m.nextTr != nil {
				closeTransport(m.tr)
				m.tr, m.nextTr = m.nextTr, nil
			}
			if m.retiring {
				m.a.retired(m)
				return
			}
			m.machine.Reconcile(m.now(), lifecycle.ReportAsleep)
			if len(m.queue) > 0 { // requests arrived while stopping
				m.apply(m.machine.Arrive(m.now()), nil)
			}
			m.noteState()
			m.publish()
		})
	}()
}

// ---- events from elsewhere, run on the loop ----

// tick checks the machine's deadlines.
func (m *model) tick() {
	m.apply(m.machine.Tick(m.now(), m.evidence()), nil)
	m.publish()
}

// engineExited handles an engine exit napd did not ask for; at dates the
// engine instance that exited (its exit, or its session's start). An
// instance older than the current wake is old news and must not fail it:
// a worker's dead session and its process exit arrive separately.
func (m *model) engineExited(reason string, at time.Time) {
	if m.exitIsStale(at) {
		m.log.Debug("engine exit from before this wake ignored", "reason", reason)
		return
	}
	m.apply(m.machine.EngineExited(m.now(), reason, m.evidence()), nil)
	m.publish()
}

// exitIsStale reports a notice about an engine instance from before the
// wake in flight (the process's own exit event may have started it).
func (m *model) exitIsStale(at time.Time) bool {
	return m.machine.Snapshot().State == lifecycle.Waking && at.Before(m.wokeAt)
}

// requestSleep asks the machine for a sleep (planner or operator).
func (m *model) requestSleep(req lifecycle.SleepRequest, engine lifecycle.EngineActivity) lifecycle.Decision {
	d := m.machine.RequestSleep(m.now(), req, lifecycle.Evidence{Leases: m.evidence(), Engine: engine})
	m.apply(d, nil)
	m.publish()
	return d
}

// ---- publishing ----

func (m *model) publish() {
	m.snap.Store(&modelSnap{
		cfg: m.cfg, spec: m.spec, lc: m.machine.Snapshot(),
		queueDepth: len(m.queue), active: m.active, lastUsed: m.lastUsed,
	})
}

func (m *model) stateChanged(before, after lifecycle.Snapshot) {
	from := ""
	if before.State != 0 {
		from = before.State.String()
	}
	attrs := []any{"from", from, "state", after.State.String(), "reason", after.Reason}
	if m.a.backend.Name() == config.SupervisorSystemd {
		attrs = append(attrs, "unit", m.spec.UnitName())
	}
	m.log.Info("state changed", attrs...)
	m.emit(control.Event{Kind: "state", From: from, To: after.State.String(), Reason: after.Reason})
	m.a.statusChanged()
}

func (m *model) emit(e control.Event) {
	e.Time = time.Now()
	e.Model = m.name
	m.a.publishEvent(e)
}
