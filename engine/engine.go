// Package engine is the contract a model implements to be served by napd
// without writing an HTTP server, and Serve, which speaks napd's ZMQ
// transport for it.
//
// The smallest worker implements two methods:
//
//	type echo struct{}
//
//	func (echo) Readiness() engine.Readiness { return engine.Readiness{State: engine.Ready} }
//	func (echo) Submit(body []byte, deadline time.Time) engine.Reply {
//		return engine.Answered(body, "application/json")
//	}
//
//	err := engine.Serve(ctx, echo{}, "ipc:///run/napd/echo.sock")
//
// Optional interfaces, found by type assertion, add what a worker can say:
// Reporter (queue depth, capacity, rejected count), Failer (a failure that
// outlives readiness) and ContextSubmitter (learn of a cancel or a passed
// deadline while working).
//
// It owns the worker side of the contract. It must not depend on napd's
// agent: a worker imports engine and its wire format only.
package engine

import (
	"context"
	"time"

	"github.com/napd/napd/engine/wire"
)

// Worker is a model served by napd.
type Worker interface {
	// Readiness says whether work may be sent now. Serve asks it before every
	// request and on every heartbeat, so it must be cheap.
	Readiness() Readiness
	// Submit starts one request and returns its reply at once or later: the
	// outcome travels on the Reply, refusals included. The deadline is when
	// the caller stops waiting (zero: none); Serve answers a Deadline
	// refusal itself when it passes.
	Submit(body []byte, deadline time.Time) Reply
}

// ContextSubmitter is implemented by a worker that wants to know when a
// request is no longer wanted. When present Serve calls SubmitContext instead
// of Submit; ctx carries the deadline and is cancelled when napd cancels the
// request (its client left), when the deadline passes, or when the session
// with napd ends.
type ContextSubmitter interface {
	SubmitContext(ctx context.Context, body []byte) Reply
}

// Reporter is implemented by a worker that owns a queue and can describe it.
type Reporter interface {
	Report() Report
}

// Failer is implemented by a worker that can fail in a way its Readiness does
// not express (for example a background loader that died). A non-empty
// Failure overrides Readiness: the worker is reported Failed with that
// reason and is sent no work. The worker keeps running so the reason can be
// read.
type Failer interface {
	Failure() string
}

// State is one of Ready, NotReady and Failed.
type State uint8

// Readiness states.
const (
	// NotReady: still loading; work will be possible later.
	NotReady State = State(wire.StateNotReady)
	// Ready: work may be sent.
	Ready State = State(wire.StateReady)
	// Failed: the worker cannot serve; Reason says why.
	Failed State = State(wire.StateFailed)
)

func (s State) String() string {
	switch s {
	case NotReady:
		return "not ready"
	case Ready:
		return "ready"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Readiness is whether a worker may be sent work, and why not.
type Readiness struct {
	State  State
	Reason string // why it is not ready or failed; may be empty when Ready
}

// Report describes a worker's queue. A nil field was not measured: it is
// never reported as zero.
type Report struct {
	Depth    *uint64 // requests waiting
	Capacity *uint64 // requests the worker admits at once
	Rejected *uint64 // requests refused with NoRoom since start (monotonic)
}

// Measured returns a pointer to n, for filling a Report.
func Measured(n uint64) *uint64 { return &n }

// RefusalKind says why a request was refused.
type RefusalKind uint8

// Refusal kinds, and the HTTP status napd answers for each.
const (
	NoRoom          RefusalKind = RefusalKind(wire.KindNoRoom)          // 503 with Retry-After: full, loading or failed
	InvalidRequest  RefusalKind = RefusalKind(wire.KindInvalidRequest)  // 400
	InferenceFailed RefusalKind = RefusalKind(wire.KindInferenceFailed) // 500
	Deadline        RefusalKind = RefusalKind(wire.KindDeadline)        // 504
)

func (k RefusalKind) String() string {
	switch k {
	case NoRoom:
		return "no room"
	case InvalidRequest:
		return "invalid request"
	case InferenceFailed:
		return "inference failed"
	case Deadline:
		return "deadline"
	}
	return "unknown"
}

// Answer is a finished answer. After chunks, Body is the stream's last piece
// (often empty) and ContentType is ignored.
type Answer struct {
	Body        []byte
	ContentType string
}

// Refusal is a request the worker will not or could not answer. Message is
// shown to the API caller: it must not contain the prompt.
type Refusal struct {
	Kind    RefusalKind
	Message string
}

func (r *Refusal) Error() string { return r.Kind.String() + ": " + r.Message }

// Chunk is one piece of a streamed answer. The first chunk's ContentType is
// the stream's (for SSE, "text/event-stream").
type Chunk struct {
	Data        []byte
	ContentType string
}

// Part is one value on a Reply: exactly one field is set. Chunk parts come
// first (none for a plain answer), then one final Answer or Refusal.
type Part struct {
	Chunk   *Chunk
	Answer  *Answer
	Refusal *Refusal
}

// Final reports whether p ends its reply.
func (p Part) Final() bool { return p.Answer != nil || p.Refusal != nil }

// Reply carries the outcome of one Submit: zero or more chunks, then exactly
// one final Answer or Refusal, after which the worker closes the channel.
// Any `chan Part` is a Reply; Answered and Refused build the common
// one-value case. Serve reads a Reply to its end even after the request is
// cancelled, so a worker that ignores cancellation never blocks on it.
type Reply <-chan Part

// Answered returns a Reply holding one final answer.
func Answered(body []byte, contentType string) Reply {
	return single(Part{Answer: &Answer{Body: body, ContentType: contentType}})
}

// Refused returns a Reply holding one refusal.
func Refused(kind RefusalKind, message string) Reply {
	return single(Part{Refusal: &Refusal{Kind: kind, Message: message}})
}

func single(p Part) Reply {
	ch := make(chan Part, 1)
	ch <- p
	close(ch)
	return ch
}

// readiness asks w how it is, letting a Failer override.
func readiness(w Worker) Readiness {
	if f, ok := w.(Failer); ok {
		if reason := f.Failure(); reason != "" {
			return Readiness{State: Failed, Reason: reason}
		}
	}
	return w.Readiness()
}
