package model

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
)

// Overflow (docs/remote.md): a request for a model with overflow targets
// goes to the first of them that can take it when napd would otherwise
// answer a room or queue 503, or (overflow_when = "late") when the wake
// it waits for is expected to end after its deadline. Only a request no
// engine saw moves, with its lease (its idempotency key stays here, so a
// retry joins it) and its deadline.

// ErrNoOverflow is Deps.Overflow's answer when no target could take the
// request: nothing moved.
var ErrNoOverflow = errors.New("no overflow target can take the request now")

// errLate is the loop's answer to a request queued for a wake expected to
// end after the request's deadline (overflow_when = "late"): it leaves
// the queue for an overflow target.
var errLate = errors.New("the wake it waits for is expected to end after its deadline")

// overflow hands w, which the model cannot serve in time (why: a room or
// queue 503, or errLate), to the model's overflow targets, unless req
// cannot be served elsewhere (not routed by name: /upstream/MODEL/…, a
// model's own socket, napd's own wakes) or the client has the first bytes
// of its answer already (a stream committed early for wake progress stays
// here). done reports
// that w is no longer the model's: t is the target's ticket, or err why
// the request ended there. Not done, nothing moved and w is still here.
func (m *Model) overflow(ctx context.Context, w *waiter, req lease.Request, why error) (t *gateway.Ticket, err error, done bool) {
	cfg := m.Snapshot().Config
	if m.d.Overflow == nil || len(cfg.Overflow) == 0 || !req.ByName || !overflows(why) || gateway.Committed(ctx) {
		return nil, nil, false
	}
	t, moved, err := m.d.Overflow(ctx, cfg.Overflow, w.id)
	if errors.Is(err, ErrNoOverflow) {
		m.log.Debug("no overflow target can take the request", "why", why.Error())
		return nil, nil, false
	}
	// Its lease moved: the loop forgets it as if it had ended here.
	w.endedAt = m.now()
	m.released(w, moved.Idle)
	if err == nil {
		m.log.Debug("request overflowed", "to", t.ServedBy, "why", why.Error())
	}
	return t, err, true
}

// overflows reports a reason to overflow: a room or queue 503, or a wake
// expected too late.
func overflows(why error) bool {
	if errors.Is(why, errLate) {
		return true
	}
	var ref *gateway.Refusal
	return errors.As(why, &ref) && ref.Status == http.StatusServiceUnavailable &&
		(ref.Code == gateway.CodeQueueFull || ref.Code == gateway.CodeInsufficientGPUMemory)
}

// overflowsLate reports a model whose requests overflow when late.
func overflowsLate(cfg *config.Model) bool {
	return len(cfg.Overflow) > 0 && cfg.OverflowWhen == config.OverflowLate
}

// RoomExpected tells the model when the make-room desk expects the GPU
// memory its wake waits for to be free (zero: it cannot tell); the
// requests queued for the wake that it makes late overflow. It does not
// wait.
func (m *Model) RoomExpected(by time.Time) {
	if !overflowsLate(m.Snapshot().Config) {
		return
	}
	m.do(func() {
		m.roomBy = by
		m.releaseLate()
		m.publish()
	})
}

// releaseLate takes out of the queue, for an overflow target, the
// requests whose deadline comes before the wake they wait for is
// expected to end; a request that came back because no target could take
// it stays.
func (m *Model) releaseLate() {
	if m.d.Overflow == nil || !overflowsLate(m.cfg) || len(m.queue) == 0 {
		return
	}
	ready := m.readyBy()
	if ready.IsZero() {
		return
	}
	var late []*waiter
	for _, w := range m.queue {
		if !w.stay && !w.deadline.IsZero() && w.deadline.Before(ready) {
			late = append(late, w)
		}
	}
	for _, w := range late {
		m.withdraw(w)
		w.tell(grant{err: errLate})
	}
}

// readyBy is when the wake under way is expected to have the model
// serving: once the room it waits for is free (the desk's estimate), a
// typical wake later; zero when napd cannot tell (nothing measured, no
// estimate, or no wake under way).
func (m *Model) readyBy() time.Time {
	lc := m.machine.Snapshot()
	if lc.State != lifecycle.Waking {
		return time.Time{}
	}
	now, wake := m.now(), m.typical.Wake
	if lc.RoomWait {
		if m.roomBy.IsZero() {
			return time.Time{}
		}
		return later(m.roomBy, now).Add(wake)
	}
	if wake == 0 {
		return time.Time{}
	}
	return later(m.wokeAt.Add(wake), now)
}
