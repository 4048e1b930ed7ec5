package model

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/gateway"
)

// waiter is one request with a lease, from its admission to its end: it
// waits for a grant, holds its slot, and is its first ticket and that
// ticket's Done and Reroute, so that admitting a request allocates little
// more than the waiter. The loop owns every field but those marked
// otherwise.
type waiter struct {
	m      *Model
	id     lease.ID
	client string // the API key's name: whose turn it is, under fair_share
	// class is the request's priority class, resolved on arrival from its
	// key's class and the one it asked for (keyClass, asked).
	class, keyClass, asked priority.Class
	arrived                time.Time
	deadline               time.Time // the request's deadline; zero = none
	granted                bool
	grantedAt              time.Time
	woke                   bool // it waited for a wake
	// stay: it waits here, never taken out as late (it cannot move, or
	// no overflow target took it).
	stay bool
	inst *instance // the engine instance it was granted to
	// reply carries the loop's answer when the request waits for it
	// (buffered 1: the loop never blocks on it). It is made only then: an
	// answer given while the request's own goroutine runs its arrival
	// inline is left in answer instead (answered), which that goroutine
	// reads once the arrival returns.
	reply    chan grant
	answer   grant
	answered bool
	// ---- the request's goroutine's ----
	ticket gateway.Ticket // the first grant's
	first  *instance      // the instance the first ticket reaches
	done   atomic.Bool    // Done was called
	// ---- set by end before the loop's part of it runs ----
	endedAt time.Time
	fault   gateway.Fault
	idle    bool // its lease was the model's last
}

// tell hands w the loop's answer g.
func (w *waiter) tell(g grant) {
	if w.reply == nil {
		w.answer, w.answered = g, true
		return
	}
	w.reply <- g
}

// waits readies w for an answer from the loop's goroutine (under the loop's
// lock, before the loop can answer it).
func (w *waiter) waits() {
	if w.reply == nil {
		w.reply = make(chan grant, 1)
	}
}

type grant struct {
	err      error
	inst     *instance
	wakeWait time.Duration
	served   string // the model's served_name when granted
	class    priority.Class
	engine   bool // engine_priority when granted
}

// ticket is the gateway's ticket for grant g (without Done and Reroute).
func (g grant) ticket() gateway.Ticket {
	return gateway.Ticket{Target: g.inst.target, Transport: g.inst.tr, WakeWait: g.wakeWait, ServedName: g.served,
		Class: g.class, EnginePriority: g.engine}
}

// ticket is the gateway's ticket for grant g of w.
func (m *Model) ticket(w *waiter, g grant) *gateway.Ticket {
	t := g.ticket()
	t.Reroute = func(ctx context.Context) (*gateway.Ticket, error) { return m.reroute(ctx, w, g.inst) }
	return &t
}

// Admit takes a lease and waits for a slot; see gateway.Models.Admit. It
// runs on the request's goroutine: the lease is taken here, and the loop
// is asked for a slot.
func (m *Model) Admit(ctx context.Context, req lease.Request) (*gateway.Ticket, error) {
	req.Model = m.name
	adm, replay, err := BeginLease(ctx, m.d.Tracker, m.d.Clock, req)
	if adm.Verdict != lease.Started {
		return replay, err
	}
	// A request that cannot be served elsewhere stays: it is never
	// taken out of the queue as late.
	w := &waiter{m: m, id: adm.ID, client: req.Client, keyClass: req.Priority, asked: req.Asked, arrived: m.now(), stay: !req.ByName}
	w.deadline, _ = ctx.Deadline()
	if !m.inlineFor(w, arrival) {
		m.end(w, cancelled)
		return nil, m.removed()
	}
	g, err := w.answer, w.answer.err
	if !w.answered {
		g, err = m.await(ctx, w)
	}
	for err != nil {
		if t, oerr, done := m.overflow(ctx, w, req, err); done {
			return t, oerr
		}
		if !errors.Is(err, errLate) {
			m.end(w, cancelled)
			return nil, err
		}
		// Late, and no overflow target could take it: it waits here
		// after all (w is in no queue: nothing else touches it now).
		w.stay, w.answered, w.answer = true, false, grant{}
		if !m.inlineFor(w, arrival) {
			m.end(w, cancelled)
			return nil, m.removed()
		}
		g, err = w.answer, w.answer.err
		if !w.answered {
			g, err = m.await(ctx, w)
		}
	}
	w.first = g.inst
	t := &w.ticket
	*t = g.ticket()
	t.Done, t.Reroute = w.Done, w.Reroute
	return t, nil
}

// BeginLease takes the lease of req, at clock's time (see
// gateway.Models.Admit): Started, a new lease for the caller to serve; or
// a replay ticket of the finished request with the same key, after
// waiting within ctx for the one in flight; or why there is neither (a
// key used for another request is 422).
func BeginLease(ctx context.Context, tr *lease.Tracker, clock func() time.Time, req lease.Request) (lease.Admission, *gateway.Ticket, error) {
	for {
		adm, err := tr.Begin(clock(), req)
		switch {
		case err != nil:
			return lease.Admission{}, nil, err
		case adm.Verdict == lease.Conflict:
			return lease.Admission{}, nil, keyReused()
		case adm.Verdict == lease.Replayed:
			return adm, &gateway.Ticket{Replay: adm.Response, Done: func(gateway.Outcome) {}}, nil
		case adm.Verdict == lease.Started:
			return adm, nil, nil
		}
		select { // Joined: wait for the first request, then ask again
		case <-adm.Wait:
		case <-ctx.Done():
			return lease.Admission{}, nil, ctx.Err()
		}
	}
}

// cancelled ends a request that never reached the engine.
var cancelled = gateway.Outcome{Outcome: lease.Outcome{Cancelled: true}}

// Done ends w's lease, once: its first ticket's Done.
func (w *waiter) Done(o gateway.Outcome) {
	if w.done.CompareAndSwap(false, true) {
		w.m.end(w, o)
	}
}

// Reroute is its first ticket's Reroute (see reroute).
func (w *waiter) Reroute(ctx context.Context) (*gateway.Ticket, error) {
	return w.m.reroute(ctx, w, w.first)
}

// arrival is a request's arrival on the loop (for inlineFor).
func arrival(w *waiter) { w.m.arrive(w) }

// await waits for the loop's answer to w: a grant, or why there is none.
func (m *Model) await(ctx context.Context, w *waiter) (grant, error) {
	select {
	case g := <-w.reply:
		return g, g.err
	case <-m.quit: // the loop ended with the arrival unhandled (removed meanwhile)
		return grant{}, m.removed()
	case <-ctx.Done():
		// The loop may have granted it meanwhile: withdraw settles either way.
		m.inline(func() { m.withdraw(w) })
		if holders := m.waitingFor(); holders != "" && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return grant{}, &gateway.Refusal{Status: http.StatusGatewayTimeout, Code: "timeout",
				Message: fmt.Sprintf("model %s: the request deadline ran out while waiting for GPU memory held by %s", m.name, holders)}
		}
		return grant{}, ctx.Err()
	}
}

// waitingFor names the holders of the GPU memory the model's wake waits
// for; "" when it does not wait.
func (m *Model) waitingFor() string {
	if m.d.WaitingFor == nil {
		return ""
	}
	return m.d.WaitingFor(m.name)
}

// reroute takes back w, granted to inst, whose connection was refused:
// the engine never saw it, so it waits for the next verified instance
// within ctx (see gateway.Ticket.Reroute). Its lease stays; the first
// ticket's Done ends it.
func (m *Model) reroute(ctx context.Context, w *waiter, inst *instance) (*gateway.Ticket, error) {
	m.mu.Lock()
	w.waits()
	m.mu.Unlock()
	if !m.do(func() { m.unreached(w, inst) }) {
		return nil, m.removed()
	}
	g, err := m.await(ctx, w)
	if err != nil {
		return nil, err
	}
	return m.ticket(w, g), nil
}

// end releases w's lease and, on the loop, its slot.
func (m *Model) end(w *waiter, o gateway.Outcome) {
	w.endedAt, w.fault = m.now(), o.Fault
	ended, _ := m.d.Tracker.End(w.endedAt, w.id, o.Outcome)
	m.released(w, ended.Idle)
}

// released is the loop's part of w's end, at w.endedAt (its lease ended,
// or moved to an overflow target); idle: it was the model's last lease.
func (m *Model) released(w *waiter, idle bool) {
	w.idle = idle
	if w.idle && m.d.Idle != nil {
		m.d.Idle()
	}
	m.inlineFor(w, ending)
}

// ending is the loop's part of a request's end (for inlineFor).
func ending(w *waiter) {
	m, now := w.m, w.endedAt
	if w.granted {
		m.release(w, now)
		m.requests.Add(now.Sub(w.grantedAt))
		m.learn()
	}
	m.lastUsed = now
	if w.inst != nil && w.inst.gone.Load() {
		// Its connection went back to the pool of an instance that is
		// gone: no request will use it again.
		w.inst.closeIdle()
	}
	if w.fault == gateway.FaultConnectTimeout && w.inst == m.eng {
		m.probeNow() // frozen, or swamped? the health watch tells
	}
	// A yielding model's drain ends with its last request in flight,
	// though the requests queued behind it still hold leases.
	if w.idle || (m.active == 0 && m.machine.Snapshot().Yielding) {
		m.apply(m.machine.LastLeaseEnded(m.now(), m.drainEvidence()), nil)
	}
	m.dispatch()
	m.afterIdle()
	m.publish()
}

// keyReused refuses an Idempotency-Key used before for another request.
func keyReused() *gateway.Refusal {
	return &gateway.Refusal{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused",
		Message: "this Idempotency-Key was used for another request (method, path, model or body differ)"}
}

// ---- on the loop ----

func (m *Model) arrive(w *waiter) {
	w.class = priority.Resolve(w.keyClass, w.asked, m.cfg.Priority)
	if m.retiring {
		w.tell(grant{err: m.removed()})
		return
	}
	if m.stopping { // the old engine is being stopped: wake the new one after
		m.enqueue(w, true)
		m.publish()
		return
	}
	if m.cfg.SelfSleep > 0 {
		m.selfSleepArrival(m.now())
	}
	m.apply(m.machine.Arrive(m.now()), w)
	m.releaseLate()
	m.publish()
}

// withdraw handles a waiter whose client left or whose deadline ran out.
func (m *Model) withdraw(w *waiter) {
	for i, q := range m.queue {
		if q == w {
			m.queue = append(m.queue[:i], m.queue[i+1:]...)
			break
		}
	}
	m.publish()
}

// enqueue admits w now when the model serves and a slot is free, else
// queues it (in arrival order; dispatch picks from it). Requests waiting for a wake may use the slots
// the wake will open plus the queue; a full queue is refused with 503.
func (m *Model) enqueue(w *waiter, forWake bool) {
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
		w.tell(grant{err: &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: gateway.CodeQueueFull,
			Message:    fmt.Sprintf("model %s: queue full (%d waiting, %d in flight)", m.name, len(m.queue), m.active),
			RetryAfter: m.queueRetry(forWake)}})
		return
	}
	m.queue = append(m.queue, w)
}

// queueRetry is when a request the full queue refused would have been
// served: the queued requests ahead of it and itself, less the slots free
// (all of them once a wake ends), take their slots max_concurrency at a
// time, each after a typical request; a queue waiting for a wake first
// waits for a typical wake, less what has passed of one under way. At least lifecycle.MinRetryAfter,
// which is all it is before anything was measured.
func (m *Model) queueRetry(forWake bool) time.Duration {
	l := m.learned()
	free := m.cfg.MaxConcurrency - m.active
	var wake time.Duration
	if forWake {
		free, wake = m.cfg.MaxConcurrency, l.Wake
		if lc := m.machine.Snapshot(); lc.State == lifecycle.Waking && !lc.RoomWait {
			wake = max(wake-m.now().Sub(m.wokeAt), 0) // under way
		}
	}
	turns := max(len(m.queue)+1-free, 0)
	d := wake + l.Request*time.Duration(turns)/time.Duration(max(m.cfg.MaxConcurrency, 1))
	return min(max(d, lifecycle.MinRetryAfter), lifecycle.MaxRetryAfter)
}

// dispatch grants queued requests while the model serves and slots are free.
func (m *Model) dispatch() {
	if len(m.queue) == 0 || !m.machine.Snapshot().State.Serving() {
		return
	}
	for len(m.queue) > 0 && m.active < m.cfg.MaxConcurrency {
		i := m.nextQueued()
		w := m.queue[i]
		m.queue = slices.Delete(m.queue, i, i+1)
		m.grant(w)
	}
}

// nextQueued is the index of the queued request to admit next: the
// highest class (aged by priority_age) first; within it the oldest or,
// under fair_share, the oldest of the client whose turn it is
// (priority.Pick).
func (m *Model) nextQueued() int {
	return priority.Pick(len(m.queue), m.queued, m.now(), m.cfg.PriorityAge, m.cfg.FairShare, m.turn)
}

// queued is the i-th queued request as priority.Pick sees it.
func (m *Model) queued(i int) priority.Queued {
	w := m.queue[i]
	return priority.Queued{Class: w.class, Arrived: w.arrived, Client: w.client}
}

func (m *Model) grant(w *waiter) {
	w.granted, w.grantedAt, w.inst = true, m.now(), m.eng
	if m.active == 0 {
		m.recent = w.class // a busy period begins
	}
	m.recent = priority.Best(m.recent, w.class)
	m.active++
	m.activeBy[w.class]++
	m.turn = w.client
	if m.d.Usage != nil {
		m.d.Usage.Begin(w.grantedAt, m.name, w.client)
	}
	g := grant{inst: m.eng, served: m.cfg.ServedName, class: w.class, engine: m.cfg.EnginePriority}
	if w.woke {
		g.wakeWait = m.now().Sub(w.arrived)
	}
	w.tell(g)
}

// unreached handles w, granted to inst, whose connection was refused. An
// instance napd still counts as serving has lost its listener: it is dying
// or dead, so it is handled as an exit (and stopped before the next wake)
// without waiting for the supervisor's word. w goes back to the head of
// the queue, for the next instance.
func (m *Model) unreached(w *waiter, inst *instance) {
	if w.granted {
		m.release(w, m.now())
	}
	w.woke = true
	w.stay = true // handed back inside the proxy: it cannot move any more
	m.queue = append([]*waiter{w}, m.queue...)
	if inst == m.eng && !inst.gone.Load() && m.machine.Snapshot().State.Serving() {
		m.log.Warn("engine refused a connection: handled as an exit")
		m.stale = true
		m.engineExited("engine refused a connection", m.now())
		return
	}
	if m.machine.Snapshot().State.Serving() {
		m.dispatch() // a newer instance serves already
		m.publish()
		return
	}
	d := m.machine.Arrive(m.now()) // a wake for it, unless one runs
	if d.Action == lifecycle.Refuse {
		m.withdraw(w)
		w.tell(grant{err: refusal(d.Refusal)})
		m.noteState()
		return
	}
	m.apply(d, nil)
	m.publish()
}

// release gives back the slot of granted w at now: the engine holds no
// more memory on its behalf.
func (m *Model) release(w *waiter, now time.Time) {
	w.granted = false
	m.active--
	m.activeBy[w.class]--
	if m.d.Usage != nil {
		m.d.Usage.End(now, m.name, w.client)
	}
}

// serving is the highest class among the requests in flight; None when
// none is.
func (m *Model) serving() priority.Class {
	for c := range m.activeBy {
		if c > 0 && m.activeBy[c] > 0 {
			return priority.Class(c)
		}
	}
	return priority.None
}

// refuseQueue refuses every queued request with err.
func (m *Model) refuseQueue(err error) {
	for _, q := range m.queue {
		q.tell(grant{err: err})
	}
	m.queue = nil
}

func refusal(r *lifecycle.Refusal) *gateway.Refusal {
	return &gateway.Refusal{Status: r.Status, Code: r.Code, Message: r.Message, RetryAfter: r.RetryAfter}
}
