package lease

import (
	"fmt"
	"time"
)

// Moved is Move's answer.
type Moved struct {
	// From is the model the lease counted for before.
	From string
	// Idle: it was that model's last live lease (as Ended.Idle).
	Idle bool
}

// Move hands live lease id to model to: a request the model it was begun
// for cannot serve in time, sent to another (an overflow target). From
// now on it counts in to's evidence, not in its first model's. Its
// idempotency key stays where it was begun: a retry of the same request
// for the first model joins it while it runs and is replayed its answer
// after, so the request never runs in two places. id must be live and
// to registered.
func (t *Tracker) Move(now time.Time, id ID, to string) (Moved, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.live[id]
	if !ok {
		return Moved{}, fmt.Errorf("lease: move: lease %d is not live", id)
	}
	dst, known := t.models[to]
	if !known {
		return Moved{}, fmt.Errorf("lease: move: unknown model %q", to)
	}
	from := l.lease.Model
	if from == to {
		return Moved{From: from}, nil
	}
	src := t.models[from]
	src.active--
	if src.active == 0 {
		src.since = now
	}
	dst.active++
	dst.since = time.Time{}
	l.lease.Model = to
	return Moved{From: from, Idle: src.active == 0}, nil
}
