package model

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

// apply performs a lifecycle decision on the loop. w is the arriving
// request, if the event was an arrival.
func (m *Model) apply(d lifecycle.Decision, w *waiter) {
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
		m.noteWakeCause(w, d.Attempt)
		m.startWake(d.Op, d.Attempt)
	case lifecycle.Refuse:
		if w != nil {
			w.tell(grant{err: refusal(d.Refusal)})
		}
	case lifecycle.AdmitWaiting:
		m.d.Metrics.Wakes.WithLabelValues(m.name, "ok").Inc()
		lc := m.machine.Snapshot()
		m.wakes.Add(lc.LastWake)
		m.learn()
		m.d.Metrics.WakeTime.WithLabelValues(m.name).Observe(lc.LastWake.Seconds())
		m.emit(control.Event{Kind: control.EventWake, Reason: d.Reason, WakeMs: lc.LastWake.Milliseconds()})
		m.dispatch()
	case lifecycle.RefuseWaiting:
		m.refuseQueue(refusal(d.Refusal))
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

// noteWakeCause accounts a wake's first attempt to the key of the request
// that started it: w, else the oldest queued (a retry after an engine
// refused a connection).
func (m *Model) noteWakeCause(w *waiter, attempt int) {
	if attempt != 1 {
		return
	}
	switch {
	case w != nil:
		m.wakeCause = w.client
	case len(m.queue) > 0:
		m.wakeCause = m.queue[0].client
	default:
		m.wakeCause = ""
	}
	if m.d.Usage != nil {
		m.d.Usage.Woke(m.now(), m.name, m.wakeCause)
	}
}

// startWake runs one wake attempt off the loop and reports back with op.
// It first waits for GPU memory (MakeRoom), bounded by the waiting
// requests' deadlines and cancelled with the wake; wake_timeout counts
// from when room is found.
func (m *Model) startWake(op lifecycle.Op, attempt int) {
	roomCtx, cancel := context.WithCancel(m.d.Ctx)
	m.wakeStop, m.wakeOp = cancel, op
	m.wokeAt, m.roomBy = m.now(), time.Time{}
	m.load = nil
	spec := m.spec
	verify := m.eng.link.Verify()
	stale := m.stale
	m.stale, m.clearing = false, stale
	cause := m.wakeCause
	cfg := m.cfg
	m.log.Info("waking", "attempt", attempt, "of", m.cfg.WakeAttempts)
	go func() {
		defer cancel()
		var waited atomic.Bool
		gpus, err := m.d.MakeRoom(roomCtx, m.name, func(holders string) {
			if !waited.Swap(true) && m.d.Usage != nil {
				m.d.Usage.Swapped(m.now(), m.name, cause)
			}
			m.do(func() {
				m.machine.WaitingForRoom(m.now(), op, "held by "+holders)
				m.noteState()
				m.publish()
			})
		})
		switch {
		case err != nil && roomCtx.Err() != nil:
			return // the machine gave up on this wake (or napd stops)
		case err != nil:
			m.do(func() { m.noRoom(op, err) })
			return
		case waited.Load():
			m.do(func() { m.machine.RoomFound(m.now(), op); m.noteState(); m.publish() })
		}
		if gpus != nil {
			spec.GPUs = gpus // chosen for this wake
		}
		if m.d.GPUDevices != nil && len(spec.GPUs) > 0 {
			spec.Devices = m.d.GPUDevices(spec.GPUs) // CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, …
		}
		spec.Command, spec.Environment = config.ExpandGPUs(spec.Command, spec.Environment, spec.GPUs)
		if c := spec.Container; c != nil {
			cc := *c // the spec's, shared with the snapshot: not changed in place
			cc.Image = config.ExpandGPUsIn([]string{c.Image}, spec.GPUs)[0]
			cc.Volumes, cc.Args = config.ExpandGPUsIn(c.Volumes, spec.GPUs), config.ExpandGPUsIn(c.Args, spec.GPUs)
			spec.Container = &cc
		}
		ctx, stop := context.WithTimeout(roomCtx, m.cfg.WakeTimeout)
		defer stop()
		m.opMu.Lock()
		if stale {
			m.log.Info("stopping an engine that stopped answering, before waking it")
			m.stopEngine(spec)
			// The wake proper starts now: the exit of the engine just
			// stopped is dated before it, so it cannot fail this wake.
			at := m.now()
			m.do(func() {
				if op == m.wakeOp {
					m.wokeAt, m.clearing = at, false
				}
			})
		}
		m.startLoad(ctx, op, cfg, spec)
		err = m.d.Supervisor.WakeVerified(ctx, spec, verify)
		if err != nil {
			m.d.Metrics.Wakes.WithLabelValues(m.name, wakeResult(err)).Inc()
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
				m.loadEnded(err == nil, m.now())
			}
			if err == nil {
				m.replaceEngine(newInstance(spec, m.eng.link))
				m.slept = ""
			}
			m.apply(m.machine.WakeDone(m.now(), op, err, m.evidence()), nil)
			m.publish()
		})
	}()
}

// stopEngine stops the engine outside the lifecycle's sleeps: after a
// failed wake, or before waking an engine that stopped answering. The
// caller holds opMu.
func (m *Model) stopEngine(spec supervisor.Spec) {
	ctx, cancel := context.WithTimeout(m.d.Ctx, m.cfg.StopTimeout+10*time.Second)
	defer cancel()
	if err := m.d.Supervisor.Sleep(ctx, spec, sleepmode.Stop); err != nil {
		m.log.Warn("stopping the engine", "err", err)
	}
	m.do(func() { m.freed = m.now() })
}

// noRoom handles a wake that does not go ahead for want of GPU memory: not
// the engine's fault, so no attempt is spent. err is the 503 that names
// what holds the memory, for the waiting requests, or why nobody waits.
func (m *Model) noRoom(op lifecycle.Op, err error) {
	if op != m.wakeOp || m.wakeStop == nil {
		return // the machine gave up on this wake: its queue belongs to another
	}
	m.wakeStop()
	m.wakeStop = nil
	m.refuseQueue(err)
	m.apply(m.machine.WakeAborted(m.now(), op, err.Error()), nil)
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
func (m *Model) startSleep(op lifecycle.Op, req lifecycle.SleepRequest) {
	spec := m.eng.spec // the running engine's
	strategy := req.Strategy
	if strategy == "" {
		strategy = m.cfg.Sleep
	}
	strategy = supervisor.Performed(strategy) // llama.cpp's own sleep cannot be asked for: stopped
	m.log.Info("putting to sleep", "strategy", strategy, "reason", req.Reason.String())
	go func() {
		ctx, cancel := context.WithTimeout(m.d.Ctx, m.cfg.StopTimeout+m.cfg.DrainTimeout+30*time.Second)
		defer cancel()
		m.opMu.Lock()
		err := m.d.Supervisor.Sleep(ctx, spec, strategy)
		m.opMu.Unlock()
		m.do(func() { m.sleepDone(op, req, strategy, err) })
	}()
}

// sleepDone applies a sleep's result. The operator sleeps waiting on it
// learn it from here: a sleep that worked is a success even when demand
// that arrived meanwhile starts a wake at once.
func (m *Model) sleepDone(op lifecycle.Op, req lifecycle.SleepRequest, strategy string, err error) {
	draining := m.machine.Snapshot().State == lifecycle.Draining
	d := m.machine.SleepDone(m.now(), op, err, m.evidence())
	if err == nil {
		m.slept, m.freed = strategy, m.now()
		m.eng.retire() // asleep: the next wake makes a new instance
		m.d.Metrics.Sleeps.WithLabelValues(m.name, sleepLabel(req)).Inc()
		m.emit(control.Event{Kind: control.EventSleep, Reason: req.Reason.String() + ", strategy " + strategy})
	}
	if draining && m.machine.Snapshot().State != lifecycle.Draining { // the result was this sleep's
		if err != nil {
			m.answerSleepers(fmt.Errorf("sleep %s: %w", m.name, err))
		} else {
			m.answerSleepers(nil)
		}
	}
	m.apply(d, nil)
	m.afterIdle()
	m.publish()
}

// Deepen moves a sleeping model down the sleep ladder: its engine, asleep
// in a light strategy, is put to sleep again with strategy (stop). The
// lifecycle state stays Sleeping; a wake arriving meanwhile waits for the
// supervisor (opMu) and then takes the path for the level reached. cause
// labels the sleep metric and event.
func (m *Model) Deepen(strategy, cause string) {
	m.do(func() {
		if m.machine.Snapshot().State != lifecycle.Sleeping || m.slept == "" || m.slept == strategy || m.deeper {
			return
		}
		m.deeper = true
		from, spec := m.slept, m.eng.spec
		m.log.Info("sleeping deeper", "from", from, "strategy", strategy, "reason", cause)
		go func() {
			ctx, cancel := context.WithTimeout(m.d.Ctx, m.cfg.StopTimeout+30*time.Second)
			defer cancel()
			m.opMu.Lock()
			defer m.opMu.Unlock()
			err := m.d.Supervisor.Sleep(ctx, spec, strategy)
			// Told before opMu is released: a wake waiting for it must
			// find the level recorded first.
			m.do(func() {
				m.deeper = false
				if err != nil {
					m.log.Warn("sleeping deeper failed", "strategy", strategy, "err", err)
					return
				}
				if m.machine.Snapshot().State == lifecycle.Sleeping && m.slept == from {
					m.slept, m.freed = strategy, m.now()
					m.d.Metrics.Sleeps.WithLabelValues(m.name, cause).Inc()
					m.emit(control.Event{Kind: control.EventSleep, Reason: cause + ", strategy " + strategy + " (from " + from + ")"})
				}
				m.publish()
			})
		}()
	})
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

// Sleep is the operator's sleep (napctl sleep): it drains live leases,
// puts the engine to sleep with strategy ("" is the model's own) and
// returns the outcome of that sleep, learned from the sleep call itself.
func (m *Model) Sleep(ctx context.Context, strategy string) error {
	result := make(chan error, 1)
	if !m.do(func() { m.operatorSleep(strategy, result) }) {
		return m.removed()
	}
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-m.quit:
		return m.removed()
	}
}

// StartSleep is Sleep without waiting for its outcome: it returns once the
// loop took the operator sleep up (a drain begun, the sleep issued, or
// asleep already), or with why it did not (unknown strategy, declined).
// The outcome shows in the model's state.
func (m *Model) StartSleep(strategy string) error {
	result := make(chan error, 1) // the outcome, later, if nobody reads it
	pending := false
	if !m.call(func() { m.operatorSleep(strategy, result); pending = len(result) == 0 }) {
		return m.removed()
	}
	if pending {
		return nil
	}
	return <-result
}

func (m *Model) operatorSleep(strategy string, result chan error) {
	if strategy == "" {
		strategy = m.cfg.Sleep
	}
	switch sleeps, err := supervisor.Sleeps(strategy); {
	case err != nil:
		result <- fmt.Errorf("sleep %s: unknown strategy %q", m.name, strategy)
		return
	case !sleeps:
		result <- fmt.Errorf("sleep %s: strategy %q never puts a model to sleep", m.name, strategy)
		return
	}
	d := m.requestSleep(lifecycle.SleepRequest{Reason: lifecycle.Operator, Strategy: strategy}, lifecycle.Evidence{})
	switch {
	case d.Action == lifecycle.Declined:
		result <- fmt.Errorf("sleep %s: %s", m.name, d.Reason)
	case m.machine.Snapshot().State == lifecycle.Sleeping:
		result <- nil
	default: // draining, or the sleep call is in flight
		m.sleepers = append(m.sleepers, result)
	}
}

// answerSleepers gives the operator sleeps waiting their outcome.
func (m *Model) answerSleepers(err error) {
	for _, s := range m.sleepers {
		s <- err
	}
	m.sleepers = nil
}

// afterIdle finishes a reload's pending work once the model is idle: a
// removed model's engine is stopped and its loop ends; a model whose engine
// spec changed has its old engine stopped, so the next request starts the
// new one. A serving model goes through the lifecycle (a drained sleep), so
// no request is cut.
func (m *Model) afterIdle() {
	if (!m.retiring && !m.restart) || m.stopping {
		return
	}
	if m.active > 0 || len(m.queue) > 0 || m.evidence().Active > 0 {
		return
	}
	switch st := m.machine.Snapshot().State; {
	case st.Serving():
		m.requestSleep(lifecycle.SleepRequest{Reason: lifecycle.Operator, Strategy: sleepmode.Stop}, lifecycle.Evidence{})
		return
	case st == lifecycle.Waking || st == lifecycle.Draining:
		return // its result calls afterIdle again
	}
	m.stopping = true
	spec := m.eng.spec
	go func() {
		m.opMu.Lock()
		m.stopEngine(spec)
		m.opMu.Unlock()
		m.do(m.stopped)
	}()
}

// stopped is the end of a reload's stop: the configured engine (and a
// changed link) becomes the one the next wake starts.
func (m *Model) stopped() {
	m.stopping, m.restart = false, false
	link := m.eng.link
	if m.nextLink != nil {
		link.Close()
		link, m.nextLink = m.nextLink, nil
	}
	m.replaceEngine(newInstance(m.spec, link))
	if m.retiring {
		m.d.Metrics.Forget(m.name)
		m.log.Info("model removed")
		m.Shutdown()
		return
	}
	m.machine.Reconcile(m.now(), lifecycle.ReportAsleep)
	if len(m.queue) > 0 { // requests arrived while stopping
		m.apply(m.machine.Arrive(m.now()), nil)
	}
	m.noteState()
	m.publish()
}

// Reconfigure applies a reloaded config to a model that stays, and waits
// until the loop did. Policy changes apply at once; an engine spec change
// restarts the engine once the model is idle, so no request is cut.
func (m *Model) Reconfigure(cfg *config.Model, spec supervisor.Spec) {
	m.call(func() { m.reconfigure(cfg, spec) })
}

func (m *Model) reconfigure(mc *config.Model, spec supervisor.Spec) {
	specChanged := !reflect.DeepEqual(spec, m.spec)
	if mc.Transport != m.cfg.Transport || mc.Address != m.cfg.Address {
		// The running engine keeps its link until it is restarted.
		if m.nextLink != nil {
			m.nextLink.Close()
		}
		m.nextLink = m.newLink(mc)
		specChanged = true
	}
	m.cfg = mc
	m.machine.Reload(m.now(), PolicyOf(mc))
	m.watch, m.watched = newWatch(mc), nil // watched afresh with the new interval
	if specChanged {
		m.spec, m.base = spec, nil
		m.restart = true
		m.log.Info("engine settings changed: the engine restarts once idle")
		m.afterIdle()
	}
	m.dispatch() // max_concurrency may have grown
	m.publish()
}

// Retire marks a model removed by a reload: queued requests are refused,
// its engine is stopped once its last lease ends, then its loop ends.
func (m *Model) Retire() {
	m.do(func() {
		m.retiring = true
		m.refuseQueue(m.removed())
		m.afterIdle()
		m.publish()
	})
}

// Observe reconciles the model with what the supervisor finds its engine
// doing (napd's start, a model added by a reload).
func (m *Model) Observe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	obs, err := m.d.Supervisor.Observe(ctx, m.Snapshot().Spec)
	report := lifecycle.ReportNoAnswer
	switch {
	case err != nil:
		m.log.Warn("cannot observe engine", "err", err)
	case obs.State == supervisor.Awake:
		report = lifecycle.ReportServing
	case obs.State == supervisor.Asleep || obs.State == supervisor.Stopped:
		report = lifecycle.ReportAsleep
	}
	m.call(func() {
		m.machine.Reconcile(m.now(), report)
		m.noteState()
		m.publish()
	})
	m.log.Info("reconciled", "found", obs.State.String(), "reason", obs.Reason)
}
