package gateway

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/agent/priority"
)

// Models is what the gateway asks of napd's model layer. The agent implements
// it on top of the lease tracker, the lifecycle and the supervisor; the
// gateway itself decides nothing about sleep or wake.
type Models interface {
	// Resolve maps a model name or alias to the model's name.
	Resolve(nameOrAlias string) (model string, ok bool)
	// List describes every model, for GET /v1/models.
	List() []ModelInfo
	// Admit takes a lease for one request and waits, within ctx, until the
	// model is awake (waking it if needed) and a concurrency slot is free.
	// It fails with a *Refusal (the model cannot take work) or with
	// ctx.Err() (the deadline ran out or the client left). A request whose
	// idempotency key is already in flight (same client) waits for that one
	// and gets its Replay; if that one was cancelled, this one runs.
	Admit(ctx context.Context, a lease.Request) (*Ticket, error)
	// QueueDepth is the number of requests waiting for a slot on model.
	QueueDepth(model string) int
}

// Ticket is an admitted request. Exactly one of these holds:
//   - Replay != nil: a finished response for the same idempotency key; send
//     it and call Done(Outcome{}).
//   - Target != nil: forward to it, then call Done with the outcome.
type Ticket struct {
	// Target is the engine's root URL; Transport reaches it (an HTTP
	// transport tuned for the engine, or a ZMQ adapter).
	Target    *url.URL
	Transport http.RoundTripper
	// ServedName, when not "", is the name the engine knows the model by
	// (served_name): the request's model is rewritten to it and the
	// answer's model mapped back to the name the client sent.
	ServedName string
	// WakeWait is how long this request waited for a wake (0 when none).
	WakeWait time.Duration
	// Class is the request's priority class as the model resolved it
	// (None when the model layer has none), sent back in X-Napd-Priority.
	// EnginePriority: the engine honours a `priority` field, which the
	// gateway sets in a JSON body to Class.Engine().
	Class          priority.Class
	EnginePriority bool
	// Remote, when set, is the model served elsewhere that Target is
	// (docs/remote.md); ServedBy, when not "", names the remote model
	// that serves a request sent away from the model it was asked for
	// (overflow): the answer says so in X-Napd-Served-By.
	Remote   *Remote
	ServedBy string
	// Replay is a stored response for a finished request with the same key.
	Replay *lease.Stored
	// Done releases the lease. It must be called exactly once.
	Done func(Outcome)
	// Reroute, when set, takes back a request that never reached the
	// engine (its connection was refused: the engine instance it was
	// granted to is gone) and waits, within ctx, for the next verified
	// instance. It returns that instance's ticket (whose Done is not
	// called: this one's still ends the lease), or why there is none (a
	// *Refusal, or ctx's error).
	Reroute func(ctx context.Context) (*Ticket, error)
}

// Outcome is how an admitted request ended: what its lease records
// (Cancelled: the client left or the deadline ran out before the response
// was complete, so it is not remembered; Response: the complete response
// to remember for idempotent replays, nil when there is no key or it was
// too large), and what went wrong on the engine's side, if anything.
type Outcome struct {
	lease.Outcome
	Fault Fault
}

// ModelInfo is one entry of GET /v1/models.
type ModelInfo struct {
	Name    string
	Aliases []string
	// Unlisted models are left out of the model lists (listed = false)
	// and still served by name.
	Unlisted bool
	State    string // lifecycle state, e.g. "awake", "sleeping"
	Reason   string // why it is in that state, when there is something to say
	// Serving: requests are forwarded at once, without a wake (awake, or
	// unsupported). GET /health/models/NAME answers 200 only then.
	Serving bool
	// RoomWaiting requests wait for its wake to get GPU memory held by
	// WaitingFor ("" when it does not wait).
	RoomWaiting int
	WaitingFor  string
	// Weights is the size of its weight files napd knows of (0: none),
	// WeightsResident how much of them is in the page cache.
	Weights, WeightsResident int64

	// For llama.cpp's router API (router.go), also in /v1/models:
	// Load is its state in that vocabulary ("" is unloaded); Failed, a
	// failed model (Reason says why); Args, the engine's command line,
	// shown to admins only.
	Load   LoadState
	Failed bool
	Args   []string
	// Progress is how far a load got, from 0 to 1, while the model
	// loads and the model layer knows it (nil: it does not); GET /models
	// and /models/sse show it.
	Progress *float64
	// Loading is the load's progress while the model wakes, when napd
	// measures it (nil: not); the napd object of /v1/models shows it.
	Loading *loadprogress.Status
}

// Quotas is what the gateway asks of napd's accounting about a key with a
// quota (docs/keys.md#quotas).
type Quotas interface {
	// Today is what the named key used in the quota window holding now
	// (the host's day), and when that window ends.
	Today(client string, now time.Time) (Use, time.Time)
}

// Use is a key's use of the box in a quota window.
type Use struct {
	GPUHours float64 // GPU memory held on its behalf, in whole-GPU hours
	Tokens   int64   // prompt and completion tokens
}

// Refusal is a request the model cannot take: the gateway answers Status
// (503 unless said otherwise) with an OpenAI-shaped error and, when
// RetryAfter > 0, a Retry-After header (a 503 always has one).
type Refusal struct {
	Status     int
	Code       string // OpenAI error code, e.g. "model_failed", "queue_full"
	Message    string
	RetryAfter time.Duration
}

func (r *Refusal) Error() string { return r.Message }

// Codes of the 503s that say there is no room for the model's wake, or no
// place in its queue: no engine saw such a request, so it may be sent to
// an overflow target (docs/remote.md).
const (
	CodeQueueFull             = "queue_full"
	CodeInsufficientGPUMemory = "insufficient_gpu_memory"
)
