package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Options configure a Supervisor.
type Options struct {
	// Logger receives the supervisor's logs; nil means slog.Default().
	Logger *slog.Logger
	// HTTPClient talks to engines' health and control endpoints; nil means
	// a loopback client without proxy. Leave its Timeout 0: every call is
	// bounded by its context.
	HTTPClient *http.Client
	// Ports, when set, verifies who listens on an HTTP engine's port:
	// before a start nothing may, after a wake and at Observe only the
	// engine's own processes. A port held by another process fails the
	// wake with a *PortError before any request reaches it.
	Ports PortCheck
}

// Supervisor drives engines through a Backend and adds what is the same for
// every backend: sleep strategies, verified health, and the observation of
// an engine's state after a restart. Calls for one model must be serialised
// by the caller (the model's owner loop); calls for different models may run
// at once.
type Supervisor struct {
	backend Backend
	log     *slog.Logger
	client  *http.Client
	ports   PortCheck

	events    chan Event
	quit      chan struct{}
	pumpDone  chan struct{}
	closeOnce sync.Once
	closeErr  error

	mu       sync.Mutex
	watchers map[*watcher]struct{}
	// slept is the strategy each model was last put to sleep with, since
	// the planner may choose another than the model's own (stop under
	// host-memory pressure) and SGLang cannot be asked.
	slept map[string]string
}

// watcher ends a wake attempt when its engine exits.
type watcher struct {
	model  string
	since  time.Time
	cancel context.CancelCauseFunc
}

// ExitError is a wake attempt ended because the engine's process exited
// (or its unit failed) while it woke.
type ExitError struct {
	Model  string
	State  ProcState // ProcFailed or ProcStopped
	Reason string    // "exit status 1", "signal: killed", systemd's Result
}

// Error says how the engine ended, e.g. "engine failed during wake: exit status 1".
func (e *ExitError) Error() string {
	return fmt.Sprintf("engine %s during wake: %s", e.State, e.Reason)
}

// New returns a Supervisor over backend. It owns the backend from now on:
// Close closes it.
func New(backend Backend, opts Options) *Supervisor {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	client := opts.HTTPClient
	if client == nil {
		client = &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: probeTimeout}).DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     30 * time.Second,
		}}
	}
	s := &Supervisor{
		backend:  backend,
		log:      log.With("backend", backend.Name()),
		client:   client,
		ports:    opts.Ports,
		events:   make(chan Event, 16),
		quit:     make(chan struct{}),
		pumpDone: make(chan struct{}),
		watchers: make(map[*watcher]struct{}),
		slept:    make(map[string]string),
	}
	go s.pump()
	return s
}

func (s *Supervisor) target(spec Spec) target {
	return target{spec: spec, backend: s.backend, client: s.client}
}

// Wake makes the engine awake and verified healthy: a stopped engine is
// started, a sleeping one is woken by the strategy that put it to sleep (or
// spec.Sleep's after a restart), and health is polled until it passes. ctx
// carries the attempt's deadline (wake_timeout). An engine that exits during
// the wake ends it at once with an *ExitError; a health check that never
// passes ends it at the deadline with a *HealthTimeoutError.
func (s *Supervisor) Wake(ctx context.Context, spec Spec) error {
	return s.WakeVerified(ctx, spec, nil)
}

// Verify decides when a started engine serves, in place of the HTTP health
// poll: it returns nil once the engine is ready, or why it never will be,
// within ctx.
type Verify func(ctx context.Context) error

// WakeVerified is Wake for an engine whose readiness napd learns another
// way than its health path (a ZMQ worker answers a readiness question):
// verify replaces the health poll; a nil verify is Wake. An engine that
// exits during the wake still ends it at once with an *ExitError.
func (s *Supervisor) WakeVerified(ctx context.Context, spec Spec, verify Verify) error {
	start := time.Now()
	ctx, done := s.watch(ctx, spec.Model, start)
	defer done()
	checkPort := false
	if verify == nil { // HTTP: the engine listens on spec.Port
		t := s.target(spec)
		verify = func(ctx context.Context) error { return t.verifyHealth(ctx, start) }
		checkPort = true
	}
	if err := s.wake(ctx, spec, verify, checkPort); err != nil {
		// Whatever step noticed it, an exit is the real reason.
		var exit *ExitError
		if errors.As(context.Cause(ctx), &exit) {
			err = exit
		}
		s.log.Warn("wake failed", "model", spec.Model, "after", time.Since(start), "err", err)
		return fmt.Errorf("wake %s: %w", spec.Model, err)
	}
	s.log.Info("engine awake", "model", spec.Model, "took", time.Since(start))
	return nil
}

func (s *Supervisor) wake(ctx context.Context, spec Spec, verify Verify, checkPort bool) error {
	t := s.target(spec)
	st, err := s.backend.Status(ctx, spec)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	wasRunning := st.State == ProcRunning || st.State == ProcStarting
	if !wasRunning {
		if checkPort {
			if err := s.checkPort(ctx, spec, false); err != nil {
				return err
			}
		}
		if err := s.backend.Start(ctx, spec); err != nil {
			return err
		}
	}
	// A running engine may still be loading (a wake that timed out before):
	// health first, then ask whether it sleeps.
	if err := verify(ctx); err != nil {
		return err
	}
	if wasRunning {
		woke, err := s.wakeIfAsleep(ctx, t)
		if err != nil {
			return err
		}
		if woke {
			if err := verify(ctx); err != nil {
				return err
			}
		}
	}
	if checkPort {
		if err := s.checkPort(ctx, spec, true); err != nil {
			return err
		}
	}
	s.setSlept(spec.Model, "")
	return nil
}

// SleepsByItself asks an engine whose strategy sleeps by itself
// (llama.cpp's idle sleep) whether it does now; false for every other
// strategy, which sleeps only when napd asks. It reads only what does not
// wake the engine.
func (s *Supervisor) SleepsByItself(ctx context.Context, spec Spec) (bool, error) {
	strat, err := lookupStrategy(spec.Sleep)
	if err != nil || !strat.self {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return strat.asleep(ctx, s.target(spec))
}

// Probe asks an awake engine's health path once, within ctx and the probe
// timeout: nil when it answered 200. It watches engines that serve; it
// neither starts nor wakes anything.
func (s *Supervisor) Probe(ctx context.Context, spec Spec) error {
	return s.target(spec).probe(ctx)
}

// wakeIfAsleep runs the wake sequence of the strategy the engine sleeps by,
// when it sleeps.
func (s *Supervisor) wakeIfAsleep(ctx context.Context, t target) (bool, error) {
	name := s.sleptWith(t.spec.Model)
	recorded := name != ""
	if !recorded {
		name = t.spec.Sleep
	}
	strat, err := lookupStrategy(name)
	if err != nil {
		return false, err
	}
	if strat.wake == nil {
		return false, nil
	}
	asleep := recorded
	if strat.asleep != nil {
		if asleep, err = strat.asleep(ctx, t); err != nil {
			return false, fmt.Errorf("ask whether it sleeps: %w", err)
		}
	}
	if !asleep {
		return false, nil
	}
	if err := strat.wake(ctx, t); err != nil {
		return false, fmt.Errorf("%s wake: %w", name, err)
	}
	return true, nil
}

// Sleep puts the engine to sleep with the named strategy (a sleepmode constant)
// and returns only once it verified the engine sleeps or is stopped. The
// caller has drained the model first.
func (s *Supervisor) Sleep(ctx context.Context, spec Spec, name string) error {
	strat, err := lookupStrategy(name)
	if err != nil {
		return fmt.Errorf("sleep %s: %w", spec.Model, err)
	}
	if strat.sleep == nil {
		return fmt.Errorf("sleep %s: strategy %q never puts an engine to sleep", spec.Model, name)
	}
	start := time.Now()
	if err := strat.sleep(ctx, s.target(spec)); err != nil {
		s.log.Warn("sleep failed", "model", spec.Model, "strategy", name, "err", err)
		return fmt.Errorf("sleep %s (%s): %w", spec.Model, name, err)
	}
	s.setSlept(spec.Model, name)
	s.log.Info("engine asleep", "model", spec.Model, "strategy", name, "took", time.Since(start))
	return nil
}

func (s *Supervisor) setSlept(model, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == "" {
		delete(s.slept, model)
	} else {
		s.slept[model] = name
	}
}

func (s *Supervisor) sleptWith(model string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slept[model]
}

// Observed is what Observe finds an engine to be.
type Observed int

const (
	// Unverified: no clear answer (backend or engine did not answer); the
	// engine must be verified healthy before it serves.
	Unverified Observed = iota
	// Awake: the process runs, health passes, and it does not sleep.
	Awake
	// Asleep: the process runs but sleeps by its strategy.
	Asleep
	// Stopped: no process runs.
	Stopped
)

// String is the lower-case name, as in logs and status output.
func (o Observed) String() string {
	switch o {
	case Awake:
		return "awake"
	case Asleep:
		return "asleep"
	case Stopped:
		return "stopped"
	}
	return "unverified"
}

// Observation is an engine's state as found by Observe, with the evidence.
type Observation struct {
	State   Observed
	Reason  string
	Process Status
}

// Observe finds out the engine's state, for reconciliation after napd
// restarts: what runs is adopted only when it is spec's (Adopter), then
// the backend's process state, then (if it runs) one health probe,
// then for strategies that can be asked (vLLM) whether it sleeps. It fails
// only for an unknown strategy; no answer is Unverified with the reason.
func (s *Supervisor) Observe(ctx context.Context, spec Spec) (Observation, error) {
	strat, err := lookupStrategy(spec.Sleep)
	if err != nil {
		return Observation{}, fmt.Errorf("observe %s: %w", spec.Model, err)
	}
	if a, ok := s.backend.(Adopter); ok {
		if err := a.Adopt(ctx, spec); err != nil {
			return Observation{State: Unverified, Reason: "adopt: " + err.Error()}, nil
		}
	}
	st, err := s.backend.Status(ctx, spec)
	if err != nil {
		return Observation{State: Unverified, Reason: "backend status: " + err.Error()}, nil
	}
	o := Observation{Process: st}
	switch st.State {
	case ProcStopped, ProcFailed:
		o.State, o.Reason = Stopped, "engine "+st.State.String()
		if st.Reason != "" {
			o.Reason += ": " + st.Reason
		}
		return o, nil
	case ProcUnknown:
		o.State, o.Reason = Unverified, "backend cannot tell the process state"
		return o, nil
	}
	t := s.target(spec)
	if err := t.probe(ctx); err != nil {
		o.State, o.Reason = Unverified, "health: "+err.Error()
		return o, nil
	}
	if err := s.checkPort(ctx, spec, true); err != nil {
		o.State, o.Reason = Unverified, err.Error()
		return o, nil
	}
	if strat.asleep != nil {
		asleep, err := strat.asleep(ctx, t)
		switch {
		case err != nil:
			o.State, o.Reason = Unverified, "healthy, but "+err.Error()
		case asleep:
			o.State, o.Reason = Asleep, "healthy and the engine reports it sleeps"
		default:
			o.State, o.Reason = Awake, "healthy and the engine reports it is awake"
		}
		return o, nil
	}
	if name := s.sleptWith(spec.Model); name != "" {
		o.State, o.Reason = Asleep, "healthy and put to sleep with "+name
		return o, nil
	}
	o.State, o.Reason = Awake, "healthy"
	return o, nil
}

// Events streams the backend's process state changes. Read it: events queue
// up in memory until read. It is closed by Close.
func (s *Supervisor) Events() <-chan Event { return s.events }

// Close closes the backend (the exec backend stops every engine; systemd
// leaves them running) and the event stream. Later calls return the first
// call's result.
func (s *Supervisor) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.backend.Close()
		close(s.quit)
		<-s.pumpDone
	})
	return s.closeErr
}

// watch returns ctx, cancelled with an *ExitError when the model's engine
// exits at or after since; done stops watching.
func (s *Supervisor) watch(ctx context.Context, model string, since time.Time) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &watcher{model: model, since: since, cancel: cancel}
	s.mu.Lock()
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
		cancel(nil)
	}
}

// notify ends the wake attempts whose engine ev says exited. Events from
// before an attempt began (the exit of a stop that preceded it) are not its.
func (s *Supervisor) notify(ev Event) {
	if ev.State != ProcFailed && ev.State != ProcStopped {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.watchers {
		if w.model == ev.Model && !ev.Time.Before(w.since) {
			w.cancel(&ExitError{Model: ev.Model, State: ev.State, Reason: ev.Reason})
		}
	}
}

// pump reads the backend's events, ends wake attempts they concern at once,
// and queues them for Events without ever blocking the backend.
func (s *Supervisor) pump() {
	defer close(s.pumpDone)
	defer close(s.events)
	in := s.backend.Events()
	var queue []Event
	for in != nil || len(queue) > 0 {
		var out chan<- Event
		var next Event
		if len(queue) > 0 {
			out, next = s.events, queue[0]
		}
		var quit <-chan struct{}
		if in == nil {
			quit = s.quit // backend closed: drop what nobody reads
		}
		select {
		case ev, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			s.notify(ev)
			queue = append(queue, ev)
		case out <- next:
			queue = queue[1:]
		case <-quit:
			return
		}
	}
}
