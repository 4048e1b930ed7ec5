// Package lease tracks every request napd proxies, from admission to its
// last byte, and turns that into the activity evidence the lifecycle and the
// planner consume.
//
// A Lease records what is in flight and nothing else: model, client label,
// request kind, whether it streams, an optional idempotency key and monotonic
// start/end times. The type has no field for a prompt, a body, a completion
// or a credential, so nothing built on it can leak one.
//
// The package is pure: it owns no clock (every call takes now, a monotonic
// reading from the caller), no goroutine and no socket. A Tracker is safe for
// concurrent use; each method is one critical section, so the check and the
// change it makes (join, replay or start) are never split.
//
// How the caller uses it:
//
//	t := lease.NewTracker(lease.Options{})
//	t.Register(model, now)               // once per configured model
//	a, err := t.Begin(now, lease.Request{Model: model, Client: c, Kind: request.Chat, IdempotencyKey: k})
//	switch a.Verdict {
//	case lease.Started:  // run the request (queue it, wake the model…), then
//		t.End(now, a.ID, lease.Outcome{Response: resp}) // after the last byte
//	case lease.Joined:   // same client+key in flight: wait, then ask again
//		<-a.Wait; a, err = t.Begin(now, req) // Replayed, or Started if the first was cancelled
//	case lease.Replayed: // send a.Response as is
//	}
//
// Queued requests hold their lease (Begin comes before queueing) and streams
// hold theirs until the last byte (End comes after it), so Evidence is
// Active for as long as anything could still reach the engine.
package lease

import (
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/request"

	"fmt"
	"net/http"
	"sync"
	"time"
)

// ID identifies a live lease. IDs are never reused within a Tracker.
type ID uint64

// Lease is one request in flight (or, once returned by End, one that ended).
// It deliberately has no field for a prompt, body, completion or credential.
type Lease struct {
	ID       ID
	Model    string
	Client   string // client label (API key name), never the key itself
	Kind     request.Kind
	Streamed bool
	Key      string    // idempotency key; "" when none
	Start    time.Time // when Begin took it
	End      time.Time // when End released it; zero while live
}

// Request describes a request asking for a lease: what the gateway admits
// (gateway.Models.Admit). It carries no body, prompt or credential.
type Request struct {
	Model  string
	Client string // the API key's name, or "" when keys are off
	Kind   request.Kind
	Stream bool
	// IdempotencyKey is the client's Idempotency-Key; "" = never joined
	// or replayed.
	IdempotencyKey string
	// Fingerprint identifies what the key was used for (the gateway hashes
	// method, path, model and body). The same key with another fingerprint
	// is Conflict, never a join or a replay of someone else's answer.
	Fingerprint string
	// Priority is the API key's class (None: the model's default) and
	// Asked the class the request asked for (X-Napd-Priority; None: not
	// asked): the model resolves its class from them (priority.Resolve).
	Priority, Asked priority.Class
	// ByName: the request names its model (in its body, form or query, on
	// an OpenAI-style route), so another model serving the same API may
	// take it, renamed (overflow). False for /upstream/MODEL/… and a
	// model's own socket, which reach that model's engine, and for napd's
	// own admissions (wakes).
	ByName bool
}

// Stored is a finished response kept for replays. The Tracker hands out the
// same value to every replay: treat it as read-only.
type Stored struct {
	Status int
	Header http.Header
	Body   []byte
}

// Outcome is how a lease ended.
type Outcome struct {
	// Cancelled: the client left or the deadline ran out before the
	// response was complete. A cancelled lease is not remembered, so a retry
	// with the same key runs.
	Cancelled bool
	// Response is the complete response to keep for replays of the same
	// key; nil when there is nothing to keep. Ignored when Cancelled or when
	// the lease has no key.
	Response *Stored
}

// Verdict is what Begin decided.
type Verdict int

const (
	// Started: a new lease was taken; run the request and End it.
	Started Verdict = iota + 1
	// Joined: the same client has a request with the same key in flight.
	// Wait for Admission.Wait to close, then call Begin again: it replays
	// the stored response, or starts this request if the first was
	// cancelled (or left nothing to replay). A joiner holds no lease, so the
	// request is counted once.
	Joined
	// Replayed: a finished response for the same client and key is stored;
	// send Admission.Response. No lease is taken.
	Replayed
	// Conflict: the same client used the key for another request (another
	// fingerprint), in flight or stored. Refuse it; no lease is taken.
	Conflict
)

func (v Verdict) String() string {
	switch v {
	case Started:
		return "started"
	case Joined:
		return "joined"
	case Replayed:
		return "replayed"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Admission is Begin's answer.
type Admission struct {
	Verdict Verdict
	// ID is the new lease (Started) or the lease joined (Joined).
	ID ID
	// Wait is closed when the joined lease ends (Joined only).
	Wait <-chan struct{}
	// Response is the stored response (Replayed only).
	Response *Stored
}

// Ended is End's answer.
type Ended struct {
	// Lease is the lease as it ended, End set.
	Lease Lease
	// Stored: the outcome's response is now stored for replays.
	Stored bool
	// Idle: this was the model's last live lease. Tell the model's lifecycle
	// (a drain may now complete).
	Idle bool
}

// Evidence is a model's activity as the lifecycle and planner see it.
type Evidence struct {
	// Active is the number of live leases (in flight or queued).
	Active int
	// Since, when Active is 0, is when the model became idle: the end of
	// its last lease, or when it was registered if it never had one.
	// Zero while Active > 0.
	Since time.Time
}

// Idle reports whether no lease is live.
func (e Evidence) Idle() bool { return e.Active == 0 }

// Stats sizes what a Tracker holds, for metrics and bound checks.
type Stats struct {
	Live        int   // live leases, all models
	Keyed       int   // live leases with an idempotency key
	Stored      int   // responses in the replay store
	StoredBytes int64 // their accounted size
}

// Tracker holds the live leases and the replay store. Safe for concurrent use.
type Tracker struct {
	mu       sync.Mutex
	last     ID
	live     map[ID]*live
	inflight map[storeKey]*live
	models   map[string]*activity
	store    store
	// spare holds ended leases' records for the next Begin: a record is
	// reachable only from live and inflight, both of which End clears, so
	// once ended nothing refers to it.
	spare []*live
}

// maxSpare bounds the records kept for reuse: about the requests a busy
// host has in flight at once.
const maxSpare = 256

type live struct {
	lease       Lease
	fingerprint string
	// scope is the model whose requests the idempotency key is among:
	// the one Begin took the lease for, also once it moved (Move).
	scope string
	done  chan struct{} // made on the first join, closed by End
}

type activity struct {
	active int
	since  time.Time
}

// NewTracker returns an empty Tracker; zero Options fields take defaults.
func NewTracker(opts Options) *Tracker {
	return &Tracker{
		live:     make(map[ID]*live),
		inflight: make(map[storeKey]*live),
		models:   make(map[string]*activity),
		store:    newStore(opts.withDefaults()),
	}
}

// Register makes model known, idle since now. Registering a known model
// changes nothing.
func (t *Tracker) Register(model string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.models[model]; !ok {
		t.models[model] = &activity{since: now}
	}
}

// Begin admits a request: a new lease, a join of the same client's request
// with the same key still in flight, or a replay of its stored response.
// The model must be registered.
func (t *Tracker) Begin(now time.Time, r Request) (Admission, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	act, ok := t.models[r.Model]
	if !ok {
		return Admission{}, fmt.Errorf("lease: begin: unknown model %q", r.Model)
	}
	t.store.expire(now)
	k := storeKey{model: r.Model, client: r.Client, key: r.IdempotencyKey}
	if r.IdempotencyKey != "" {
		if p, ok := t.inflight[k]; ok {
			if p.fingerprint != r.Fingerprint {
				return Admission{Verdict: Conflict}, nil
			}
			if p.done == nil {
				p.done = make(chan struct{})
			}
			return Admission{Verdict: Joined, ID: p.lease.ID, Wait: p.done}, nil
		}
		if resp, fp := t.store.get(k); resp != nil {
			if fp != r.Fingerprint {
				return Admission{Verdict: Conflict}, nil
			}
			return Admission{Verdict: Replayed, Response: resp}, nil
		}
	}
	t.last++
	var l *live
	if n := len(t.spare); n > 0 {
		l, t.spare = t.spare[n-1], t.spare[:n-1]
	} else {
		l = new(live)
	}
	*l = live{lease: Lease{
		ID: t.last, Model: r.Model, Client: r.Client, Kind: r.Kind,
		Streamed: r.Stream, Key: r.IdempotencyKey, Start: now,
	}, fingerprint: r.Fingerprint, scope: r.Model}
	t.live[l.lease.ID] = l
	if r.IdempotencyKey != "" {
		t.inflight[k] = l
	}
	act.active++
	act.since = time.Time{}
	return Admission{Verdict: Started, ID: l.lease.ID}, nil
}

// End releases lease id with its outcome. A finished (not cancelled) keyed
// lease's response is stored for replays before any joiner is woken, so a
// joiner that asks again sees it. ok is false when id is not live (already
// ended, or never begun).
func (t *Tracker) End(now time.Time, id ID, out Outcome) (e Ended, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.live[id]
	if !ok {
		return Ended{}, false
	}
	delete(t.live, id)
	l.lease.End = now
	act := t.models[l.lease.Model]
	act.active--
	if act.active == 0 {
		act.since = now
	}
	stored := false
	if l.lease.Key != "" {
		k := storeKey{model: l.scope, client: l.lease.Client, key: l.lease.Key}
		delete(t.inflight, k)
		if !out.Cancelled && out.Response != nil {
			t.store.expire(now)
			stored = t.store.put(now, k, l.fingerprint, out.Response)
		}
	}
	if l.done != nil {
		close(l.done)
	}
	e = Ended{Lease: l.lease, Stored: stored, Idle: act.active == 0}
	if len(t.spare) < maxSpare {
		*l = live{}
		t.spare = append(t.spare, l)
	}
	return e, true
}

// Evidence reports model's activity; ok is false for an unregistered model.
func (t *Tracker) Evidence(model string) (e Evidence, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	act, ok := t.models[model]
	if !ok {
		return Evidence{}, false
	}
	return Evidence{Active: act.active, Since: act.since}, true
}

// Stats sizes what the tracker holds.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Stats{
		Live:        len(t.live),
		Keyed:       len(t.inflight),
		Stored:      t.store.len(),
		StoredBytes: t.store.bytes,
	}
}
