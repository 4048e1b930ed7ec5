package agent

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
)

// roomPoll is how often waiting wakes are planned again while any waits:
// memory coming back is seen by measuring, not announced. A refusal stands
// only on a measurement that began roomSettle after every engine stop (else
// napd measures again roomConfirm later): the GPU's process list
// and the engines' are not read at one instant, and an engine that is
// exiting (or whose memory the driver has not yet given back) can look like
// memory of a process napd does not manage. On a busy machine a probe can
// take longer than the stop, so the measurement's start is what counts,
// not the time the plan is read.
// A holder asked to sleep for a waiting wake is asked again after
// roomReask if the plan still wants it (the lifecycle may have declined:
// its engine reported work a moment before), or at once when it looks idle
// and did not when asked (its last request ended, the engine's evidence
// turned): the decline may no longer hold, and a waiting request should
// not wait out roomReask for nothing.
const (
	roomPoll    = 250 * time.Millisecond
	roomConfirm = 100 * time.Millisecond
	roomSettle  = time.Second
	roomReask   = 5 * time.Second
)

// room is the make-room desk. A wake that does not fit registers here and
// waits; one goroutine (roomLoop) plans room for every waiting model at
// once (planner.PlanRoom), acts on each decision once, and answers each
// wake when its turn comes. The mutex guards the registrations only.
type room struct {
	mu    sync.Mutex
	waits map[string]*roomWait // by model
	// loading are the models whose wake was told it fits and goes on: a
	// waking model not in it is about to ask for room, and is planned as
	// waiting, not as loading.
	loading map[string]bool
	kick    chan struct{} // buffered 1: plan again now
	// waiting is len(waits), readable without the mutex: a request's end
	// asks for a round only while some wake waits.
	waiting atomic.Int32
}

// roomWait is one wake waiting for memory.
type roomWait struct {
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
// it: not asked before, asked roomReask ago, or seen idle now and not
// when last asked (its last request ended, its engine's evidence turned).
// A busy holder changes with every request: it is not asked again for
// that, so each decision stays one log line and one event.
func (w *roomWait) ask(key string, now time.Time, seen holderView) bool {
	if prev, ok := w.acted[key]; ok && now.Sub(prev.at) < roomReask && (prev.seen == seen || !seen.idle()) {
		return false
	}
	w.acted[key] = asked{at: now, seen: seen}
	return true
}

func newRoom() *room {
	return &room{waits: make(map[string]*roomWait), loading: make(map[string]bool), kick: make(chan struct{}, 1)}
}

// errNobodyWaits ends a room wait whose requests all left.
var errNobodyWaits = errors.New("its requests left while it waited for GPU memory")

func (r *room) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// modelIdle is told when a model's last request ends: memory a wake waits
// for may be free now. With nobody waiting there is nothing to plan, and
// the request's path does not wake the desk's goroutine.
func (r *room) modelIdle() {
	if r.waiting.Load() > 0 {
		r.poke()
	}
}

// counted updates waiting after waits changed; r.mu is held.
func (r *room) counted() { r.waiting.Store(int32(len(r.waits))) }

// waitingFor returns what the model's wake waits for ("" if it does not
// wait), for status and for the 504 of a request whose deadline ran out.
func (r *room) waitingFor(model string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w := r.waits[model]; w != nil {
		return planner.HolderList(w.holders)
	}
	return ""
}

// makeRoom is the wake's fit-before-wake: it returns once the model fits
// in the free memory of its GPUs, a 503 Refusal naming the holders when
// room can never appear in time, errNobodyWaits when its requests left, or
// ctx's error. A model with gpus = "any" or { count = N } has its GPUs
// chosen first; they are returned (nil for a fixed list). While it waits,
// waiting is told what for (on changes only). It runs on the wake's
// goroutine.
func (a *Agent) makeRoom(ctx context.Context, name string, waiting func(why string)) ([]int, error) {
	m := a.reg.Load().byName[name]
	if m == nil {
		return nil, nil
	}
	if err := a.maxAwake(ctx, name, waiting); err != nil {
		return nil, err
	}
	var gpus []int
	if cfg := m.Snapshot().Config; cfg.GPUCount > 0 {
		var err error
		if gpus, err = a.place(a.measure(ctx), name); err != nil {
			return nil, err
		}
	}
	if s := m.Snapshot(); len(a.gpusOf(s)) == 0 || a.footprint(s) == 0 {
		return gpus, nil // nothing to check it against
	}
	w := &roomWait{since: a.clock(), answer: make(chan error, 1), waiting: waiting, acted: make(map[string]asked)}
	r := a.room
	r.mu.Lock()
	r.waits[name] = w
	r.counted()
	delete(r.loading, name)
	r.mu.Unlock()
	r.poke()
	defer func() {
		r.mu.Lock()
		if r.waits[name] == w {
			delete(r.waits, name)
			r.counted()
		}
		r.mu.Unlock()
	}()
	select {
	case err := <-w.answer:
		return gpus, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// roomLoop plans room while wakes wait: at once when one registers or a
// model changes state, and every roomPoll while any waits.
func (a *Agent) roomLoop(ctx context.Context) {
	defer a.helpers.Done()
	poll := time.NewTimer(time.Hour)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.room.kick:
		case <-poll.C:
		}
		if next := a.roomRound(ctx); next > 0 {
			poll.Reset(next)
		}
	}
}

// roomRound is one planning round over the waiting wakes; it returns when
// to plan again, 0 when nobody waits.
func (a *Agent) roomRound(ctx context.Context) time.Duration {
	r := a.room
	reg := a.reg.Load()
	r.mu.Lock()
	waits := make(map[string]*roomWait, len(r.waits))
	for name, w := range r.waits {
		waits[name] = w
	}
	var coming []string // waking, about to ask for room
	for _, m := range reg.list {
		if m.Snapshot().Lifecycle.State != lifecycle.Waking {
			delete(r.loading, m.Name())
		} else if !r.loading[m.Name()] && waits[m.Name()] == nil {
			coming = append(coming, m.Name())
		}
	}
	r.mu.Unlock()
	if len(waits) == 0 {
		// Nobody waits for memory: a yield in progress is taken back.
		for _, m := range reg.list {
			if m.Snapshot().Lifecycle.Yielding {
				m.CancelYield()
			}
		}
		return 0
	}

	ms := a.measure(ctx)
	in := a.plannerInput(ms)
	var waiters []planner.Waiter
	for name, w := range waits {
		m := reg.byName[name]
		ev, _ := a.tracker.Evidence(name)
		if m == nil || ev.Active == 0 {
			a.answerRoom(name, w, errNobodyWaits)
			continue
		}
		s := m.Snapshot()
		oldest := s.Oldest
		if oldest.IsZero() { // an operator wake: no request queued
			oldest = w.since
		}
		waiters = append(waiters, planner.Waiter{Model: name, Oldest: oldest, Deadline: s.Deadline, Requests: s.QueueDepth})
	}
	for _, name := range coming {
		s := reg.byName[name].Snapshot()
		oldest := s.Oldest
		if oldest.IsZero() {
			oldest = s.Lifecycle.Since
		}
		waiters = append(waiters, planner.Waiter{Model: name, Oldest: oldest, Deadline: s.Deadline, Requests: s.QueueDepth})
	}
	plan := planner.PlanRoom(in, waiters)
	a.actForRoom(ms, plan, waits)
	var next time.Duration
	for _, t := range plan.Turns {
		w := waits[t.Model]
		if w == nil {
			continue // not asking yet: it takes its turn once it does
		}
		switch t.Verdict {
		case planner.RoomFits:
			a.log.Debug("room for a wake", "model", t.Model, "why", t.Message)
			a.answerRoom(t.Model, w, nil)
		case planner.RoomRefused:
			if a.inFlux(reg, ms.at) { // not a reading to refuse on: measure again
				if next == 0 || next > roomConfirm {
					next = roomConfirm
				}
				continue
			}
			a.log.Warn("wake refused: not enough GPU memory", "model", t.Model, "why", t.Message, "retry_after", t.RetryAfter)
			a.answerRoom(t.Model, w, &gateway.Refusal{Status: http.StatusServiceUnavailable,
				Code: "insufficient_gpu_memory", Message: t.Message, RetryAfter: t.RetryAfter})
		default: // RoomWait, or RoomExpired: its requests leave on their own deadlines
			if next == 0 {
				next = roomPoll
			}
			r.mu.Lock()
			w.holders = t.Holders
			r.mu.Unlock()
			if t.Message != w.told {
				if w.told == "" {
					a.metrics.RoomWaits.WithLabelValues(t.Model).Inc()
				}
				w.told = t.Message
				a.log.Info("waiting for GPU memory", "model", t.Model, "why", t.Message)
				w.waiting(planner.HolderList(t.Holders))
			}
		}
	}
	return next
}

// inFlux reports whether a measurement that began at measured may catch an
// engine half gone: one is draining, or one gave its memory back (a sleep,
// a stop, an exit) less than roomSettle before the measurement began or
// after it. The model's state does not tell: a holder that yielded may be
// waking again for its own queued requests by the time the plan is read.
func (a *Agent) inFlux(reg *registry, measured time.Time) bool {
	for _, m := range reg.list {
		s := m.Snapshot()
		if s.Lifecycle.State == lifecycle.Draining || (!s.Freed.IsZero() && measured.Sub(s.Freed) < roomSettle) {
			return true
		}
	}
	return false
}

// answerRoom ends a wait with err (nil: it fits).
func (a *Agent) answerRoom(model string, w *roomWait, err error) {
	if w.told != "" {
		a.metrics.RoomWait.WithLabelValues(model).Observe(a.clock().Sub(w.since).Seconds())
	}
	select {
	case w.answer <- err:
	default:
	}
	a.room.mu.Lock()
	if a.room.waits[model] == w {
		delete(a.room.waits, model)
		a.room.counted()
	}
	if err == nil {
		a.room.loading[model] = true
	}
	a.room.mu.Unlock()
}

// actForRoom asks the holders the plan puts to sleep, each once per
// waiting wake (again if still wanted after roomReask, or once the holder
// turned idle): idle ones now, busy
// ones to yield. Demand overrides the
// idle minimum; the lifecycle still checks the proof of idleness.
func (a *Agent) actForRoom(ms *measurement, plan planner.RoomPlan, waits map[string]*roomWait) {
	var fresh []planner.Decision
	reg := a.reg.Load()
	for _, d := range plan.Sleeps {
		w := waits[waiterOf(plan, d.Model)]
		key := d.Model + "/" + string(d.Reason)
		if w == nil {
			continue // its wake has not asked yet: it is asked for once it does
		}
		seen := holderView{engine: ms.models[d.Model].activity}
		if m := reg.byName[d.Model]; m != nil {
			snap := m.Snapshot()
			seen.state, seen.active, seen.lastUsed = snap.Lifecycle.State, snap.Active, snap.LastUsed
		}
		if w.ask(key, a.clock(), seen) {
			fresh = append(fresh, d)
		}
	}
	a.act(ms, fresh)
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

// sleepReason maps a planner decision onto the lifecycle's sleep reason.
func sleepReason(r planner.Reason) lifecycle.SleepReason {
	switch r {
	case planner.ReasonIdle:
		return lifecycle.IdleTimeout
	case planner.ReasonMakeRoom, planner.ReasonYield, planner.ReasonMaxAwake:
		return lifecycle.Demand
	}
	return lifecycle.MemoryPressure
}
