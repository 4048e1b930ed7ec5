// Package room is the make-room desk: where napd's models get and give
// back GPU memory. A wake that does not fit registers here and waits; one
// goroutine (Run) plans room for every waiting model at once
// (planner.PlanRoom), asks the holders the plan chooses to sleep (idle ones
// now, busy ones to yield after yield_after), and answers each wake when
// its turn comes, by its oldest waiting request. It also performs the
// planner's periodic round (Plan: idle timeouts, memory pressure, the sleep
// ladder), the warm wakes (warm_on_start, keep_awake windows), the
// max_awake limit, the GPU choice of models with gpus = "any" or
// { count = N }, and what napd expects each model to hold (footprints).
//
// It owns the waits, the models whose wake was told it fits (loading), the
// last measurement, the chosen placements and the footprint estimates.
// What it needs from the rest of napd comes in Deps: the models (an
// interface: *model.Model in napd), the measurements, the lease evidence,
// the memos, the metrics, the event sink and the clock, with timers on it.
// It decides nothing itself: the pure planner (agent/planner) decides,
// the desk performs, and each model's lifecycle has the last word on a
// sleep.
package room

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
)

// Poll is how often waiting wakes are planned again while any waits:
// memory coming back is seen by measuring, not announced. A refusal stands
// only on a measurement that began Settle after every engine stop (else
// the desk measures again Confirm later): the GPU's process list and the
// engines' are not read at one instant, and an engine that is exiting (or
// whose memory the driver has not yet given back) can look like memory of
// a process napd does not manage. On a busy machine a probe can take
// longer than the stop, so the measurement's start is what counts, not the
// time the plan is read. A holder asked to sleep for a waiting wake is
// asked again after Reask if the plan still wants it (the lifecycle may
// have declined: its engine reported work a moment before), or at once
// when it looks idle and did not when asked (its last request ended, the
// engine's evidence turned): the decline may no longer hold, and a waiting
// request should not wait out Reask for nothing.
const (
	Poll    = 250 * time.Millisecond
	Confirm = 100 * time.Millisecond
	Settle  = time.Second
	Reask   = 5 * time.Second
)

// Model is one model as the desk sees it: *model.Model in napd.
type Model interface {
	Name() string
	Snapshot() model.Snapshot
	// Admit takes a lease and waits for the model to serve it: a warm
	// wake is an arrival with no request behind it.
	Admit(ctx context.Context, req lease.Request) (*gateway.Ticket, error)
	// RequestSleep hands the lifecycle a sleep the planner decided; it
	// may decline. It must not block.
	RequestSleep(req lifecycle.SleepRequest, engine lifecycle.Evidence)
	// Deepen moves a sleeping model down its sleep ladder. It must not
	// block.
	Deepen(strategy, cause string)
	// CancelYield takes back a yield nobody waits for any more. It must
	// not block.
	CancelYield()
}

// Memo remembers a number per model across restarts (*memo.Store in
// napd: state_dir's footprints.json and placements.json).
type Memo interface {
	Get(model string) (int64, bool)
	Remember(model string, v int64) error
}

// Deps is everything the desk uses from the rest of napd.
type Deps struct {
	// Models are the models of the config generation running now.
	Models func() []Model
	// Config is the config running now: [pressure], policy.max_awake and
	// the models' keep_awake and warm_on_start.
	Config func() *config.Config
	// Measure runs the probes over the models whose snapshots it is
	// given (measure.Prober in napd). It may block for a few seconds.
	Measure func(ctx context.Context, models []model.Snapshot) *measure.Measurement
	// Leases is the lease tracker's evidence of a model.
	Leases func(model string) lease.Evidence
	// Footprints are the learned GPU footprints; Placements the GPU sets
	// chosen for placed models (bitmasks of GPU indexes).
	Footprints, Placements Memo
	Metrics                *metrics.Metrics
	// Emit receives the planner's decisions as events. It must not block.
	Emit func(control.Event)
	// Clock is napd's clock: every time handed to the planner comes from
	// it. After is a timer on it (time.After in napd): the poll while
	// wakes wait, and the wait for max_awake.
	Clock func() time.Time
	After func(time.Duration) <-chan time.Time
	Log   *slog.Logger
	// Expect, when set, is told after each round when the memory a
	// waiting model's wake waits for is expected to be free (zero: it
	// cannot be told): a request that would be served after its deadline
	// may overflow (docs/remote.md). It must not block.
	Expect func(model string, by time.Time)
}

// Desk is the make-room desk.
type Desk struct {
	d Deps
	// mu guards the registrations: waits, loading and each wait's holders.
	mu    sync.Mutex
	waits map[string]*wait // by model
	// loading are the models whose wake was told it fits and goes on: a
	// waking model not in it is about to ask for room, and is planned as
	// waiting, not as loading.
	loading map[string]bool
	kick    chan struct{} // buffered 1: plan again now
	// waiting is len(waits), readable without the mutex: a request's end
	// asks for a round only while some wake waits.
	waiting atomic.Int32

	measured  atomic.Pointer[measure.Measurement] // the last round's
	placement placements
	estimates estimates
	// Of Plan's caller alone (napd's ticker): the pressure last reported
	// unrelieved, and when keep_awake windows were last looked at.
	unrelieved string
	windowsAt  time.Time
}

// New returns the desk; Run runs its loop.
func New(d Deps) *Desk {
	if d.After == nil {
		d.After = time.After
	}
	return &Desk{
		d: d, waits: make(map[string]*wait), loading: make(map[string]bool), kick: make(chan struct{}, 1),
		placement: placements{why: make(map[string]string)},
		estimates: estimates{files: make(map[string]fileEstimate), logged: make(map[string]int64)},
		windowsAt: d.Clock(),
	}
}

// wait is one wake waiting for memory.
type wait struct {
	since   time.Time
	answer  chan error       // buffered 1: nil (fits) or why the wake does not go ahead
	waiting func(why string) // tells the model's loop what it waits for
	holders []planner.Holder // what it waits for, as last planned
	told    string           // the message last told
	acted   map[string]asked // holders asked to sleep for it (model/reason)
}

// asked is when a holder was asked to sleep, and what napd knew of it then.
type asked struct {
	at   time.Time
	seen holderView
}

// holderView is what a holder's answer to a sleep request depends on.
type holderView struct {
	engine   planner.Engine
	state    lifecycle.State
	active   int
	lastUsed time.Time
}

// idle: nothing in flight that napd or the engine's evidence knows of.
func (v holderView) idle() bool { return v.active == 0 && v.engine != planner.EngineBusy }

// ask reports whether the holder under key is to be asked now, and notes
// it: not asked before, asked Reask ago, or seen idle now and not when
// last asked (its last request ended, its engine's evidence turned). A
// busy holder changes with every request: it is not asked again for that,
// so each decision stays one log line and one event.
func (w *wait) ask(key string, now time.Time, seen holderView) bool {
	if prev, ok := w.acted[key]; ok && now.Sub(prev.at) < Reask && (prev.seen == seen || !seen.idle()) {
		return false
	}
	w.acted[key] = asked{at: now, seen: seen}
	return true
}

// ErrNobodyWaits ends a room wait whose requests all left.
var ErrNobodyWaits = errors.New("its requests left while it waited for GPU memory")

// Poke asks for a planning round now: a model changed state, and memory a
// wake waits for may be coming back.
func (d *Desk) Poke() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// ModelIdle is told when a model's last request ends: memory a wake waits
// for may be free now. With nobody waiting there is nothing to plan, and
// the request's path does not wake the desk's goroutine.
func (d *Desk) ModelIdle() {
	if d.waiting.Load() > 0 {
		d.Poke()
	}
}

// counted updates waiting after waits changed; d.mu is held.
func (d *Desk) counted() { d.waiting.Store(int32(len(d.waits))) }

// WaitingFor returns what the model's wake waits for ("" if it does not
// wait), for status and for the 504 of a request whose deadline ran out.
func (d *Desk) WaitingFor(model string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.waits[model]; w != nil {
		return planner.HolderList(w.holders)
	}
	return ""
}

// Measured is the last round's measurement, nil before the first.
func (d *Desk) Measured() *measure.Measurement { return d.measured.Load() }

// measure runs a round of probes over the models and publishes it.
func (d *Desk) measure(ctx context.Context, models []Model) *measure.Measurement {
	snaps := make([]model.Snapshot, len(models))
	for i, m := range models {
		snaps[i] = m.Snapshot()
	}
	ms := d.d.Measure(ctx, snaps)
	d.measured.Store(ms)
	return ms
}

// find is the model named name among models, nil when none is.
func find(models []Model, name string) Model {
	for _, m := range models {
		if m.Name() == name {
			return m
		}
	}
	return nil
}

// MakeRoom is the wake's fit-before-wake (model.Deps MakeRoom): it returns
// once the model fits in the free memory of its GPUs, a 503 Refusal naming
// the holders when room can never appear in time, ErrNobodyWaits when its
// requests left, or ctx's error. A model with gpus = "any" or
// { count = N } has its GPUs chosen first; they are returned (nil for a
// fixed list). While it waits, waiting is told what for (on changes only).
// It runs on the wake's goroutine.
func (d *Desk) MakeRoom(ctx context.Context, name string, waiting func(why string)) ([]int, error) {
	m := find(d.d.Models(), name)
	if m == nil {
		return nil, nil
	}
	if err := d.maxAwake(ctx, name, waiting); err != nil {
		return nil, err
	}
	var gpus []int
	if cfg := m.Snapshot().Config; cfg.GPUCount > 0 {
		models := d.d.Models() // after max_awake's wait, which may have been long
		var err error
		if gpus, err = d.place(d.measure(ctx, models), models, name); err != nil {
			return nil, err
		}
	}
	if s := m.Snapshot(); len(d.GPUs(s)) == 0 || d.Footprint(s).Bytes == 0 {
		return gpus, nil // nothing to check it against
	}
	w := &wait{since: d.d.Clock(), answer: make(chan error, 1), waiting: waiting, acted: make(map[string]asked)}
	d.mu.Lock()
	d.waits[name] = w
	d.counted()
	delete(d.loading, name)
	d.mu.Unlock()
	d.Poke()
	defer func() {
		d.mu.Lock()
		if d.waits[name] == w {
			delete(d.waits, name)
			d.counted()
		}
		d.mu.Unlock()
	}()
	select {
	case err := <-w.answer:
		return gpus, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Run plans room while wakes wait: at once when one registers or a model
// changes state (Poke), and every Poll on the desk's clock while any
// waits. It returns when ctx ends.
func (d *Desk) Run(ctx context.Context) {
	var poll <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
		case <-poll:
		}
		poll = nil
		if next := d.Round(ctx); next > 0 {
			poll = d.d.After(next)
		}
	}
}

// Round is one planning round over the waiting wakes; it returns when to
// plan again, 0 when nobody waits. Run calls it; a test may too.
func (d *Desk) Round(ctx context.Context) time.Duration {
	models := d.d.Models()
	d.mu.Lock()
	waits := make(map[string]*wait, len(d.waits))
	for name, w := range d.waits {
		waits[name] = w
	}
	var coming []Model // waking, about to ask for room
	for _, m := range models {
		if m.Snapshot().Lifecycle.State != lifecycle.Waking {
			delete(d.loading, m.Name())
		} else if !d.loading[m.Name()] && waits[m.Name()] == nil {
			coming = append(coming, m)
		}
	}
	d.mu.Unlock()
	if len(waits) == 0 {
		// Nobody waits for memory: a yield in progress is taken back.
		for _, m := range models {
			if m.Snapshot().Lifecycle.Yielding {
				m.CancelYield()
			}
		}
		return 0
	}

	ms := d.measure(ctx, models)
	in := d.input(ms, models)
	var waiters []planner.Waiter
	for name, w := range waits {
		m := find(models, name)
		if m == nil || d.d.Leases(name).Active == 0 {
			d.answer(name, w, ErrNobodyWaits)
			continue
		}
		s := m.Snapshot()
		oldest := s.Oldest
		if oldest.IsZero() { // an operator wake: no request queued
			oldest = w.since
		}
		waiters = append(waiters, planner.Waiter{Model: name, Oldest: oldest, Deadline: s.Deadline, Requests: s.QueueDepth, Queued: s.Queued})
	}
	for _, m := range coming {
		s := m.Snapshot()
		oldest := s.Oldest
		if oldest.IsZero() {
			oldest = s.Lifecycle.Since
		}
		waiters = append(waiters, planner.Waiter{Model: m.Name(), Oldest: oldest, Deadline: s.Deadline, Requests: s.QueueDepth, Queued: s.Queued})
	}
	plan := planner.PlanRoom(in, waiters)
	d.actForRoom(ms, models, plan, waits)
	var next time.Duration
	for _, t := range plan.Turns {
		w := waits[t.Model]
		if w == nil {
			continue // not asking yet: it takes its turn once it does
		}
		switch t.Verdict {
		case planner.RoomFits:
			d.d.Log.Debug("room for a wake", "model", t.Model, "why", t.Message)
			d.answer(t.Model, w, nil)
		case planner.RoomRefused:
			if inFlux(models, ms.At) { // not a reading to refuse on: measure again
				if next == 0 || next > Confirm {
					next = Confirm
				}
				continue
			}
			d.d.Log.Warn("wake refused: not enough GPU memory", "model", t.Model, "why", t.Message, "retry_after", t.RetryAfter)
			d.answer(t.Model, w, &gateway.Refusal{Status: http.StatusServiceUnavailable,
				Code: gateway.CodeInsufficientGPUMemory, Message: t.Message, RetryAfter: t.RetryAfter})
		default: // RoomWait, or RoomExpired: its requests leave on their own deadlines
			if next == 0 {
				next = Poll
			}
			if d.d.Expect != nil && t.Verdict == planner.RoomWait {
				d.d.Expect(t.Model, t.ReadyBy)
			}
			d.mu.Lock()
			w.holders = t.Holders
			d.mu.Unlock()
			if t.Message != w.told {
				if w.told == "" {
					d.d.Metrics.RoomWaits.WithLabelValues(t.Model).Inc()
				}
				w.told = t.Message
				d.d.Log.Info("waiting for GPU memory", "model", t.Model, "why", t.Message)
				w.waiting(planner.HolderList(t.Holders))
			}
		}
	}
	return next
}

// inFlux reports whether a measurement that began at measured may catch an
// engine half gone: one is draining, or one gave its memory back (a sleep,
// a stop, an exit) less than Settle before the measurement began or after
// it. The model's state does not tell: a holder that yielded may be waking
// again for its own queued requests by the time the plan is read.
func inFlux(models []Model, measured time.Time) bool {
	for _, m := range models {
		s := m.Snapshot()
		if s.Lifecycle.State == lifecycle.Draining || (!s.Freed.IsZero() && measured.Sub(s.Freed) < Settle) {
			return true
		}
	}
	return false
}

// answer ends a wait with err (nil: it fits).
func (d *Desk) answer(model string, w *wait, err error) {
	if w.told != "" {
		d.d.Metrics.RoomWait.WithLabelValues(model).Observe(d.d.Clock().Sub(w.since).Seconds())
	}
	select {
	case w.answer <- err:
	default:
	}
	d.mu.Lock()
	if d.waits[model] == w {
		delete(d.waits, model)
		d.counted()
	}
	if err == nil {
		d.loading[model] = true
	}
	d.mu.Unlock()
}

// actForRoom asks the holders the plan puts to sleep, each once per
// waiting wake (again if still wanted after Reask, or once the holder
// turned idle): idle ones now, busy ones to yield. Demand overrides the
// idle minimum; the lifecycle still checks the proof of idleness.
func (d *Desk) actForRoom(ms *measure.Measurement, models []Model, plan planner.RoomPlan, waits map[string]*wait) {
	var fresh []planner.Decision
	for _, dec := range plan.Sleeps {
		w := waits[waiterOf(plan, dec.Model)]
		key := dec.Model + "/" + string(dec.Reason)
		if w == nil {
			continue // its wake has not asked yet: it is asked for once it does
		}
		seen := holderView{engine: ms.Models[dec.Model].Activity}
		if m := find(models, dec.Model); m != nil {
			snap := m.Snapshot()
			seen.state, seen.active, seen.lastUsed = snap.Lifecycle.State, snap.Active, snap.LastUsed
		}
		if w.ask(key, d.d.Clock(), seen) {
			fresh = append(fresh, dec)
		}
	}
	d.act(ms, models, fresh)
}

// waiterOf is the waiting model a holder is put to sleep for.
func waiterOf(plan planner.RoomPlan, holder string) string {
	for _, t := range plan.Turns {
		for _, h := range t.Holders {
			if h.Model == holder && h.Label.Freed() {
				return t.Model
			}
		}
	}
	return ""
}
