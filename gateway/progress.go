package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/lease"
)

// Progress is implemented by Models that offer wake progress: for a model
// where Progress says ok, a streaming request that waits to be admitted
// longer than Options.ProgressAfter gets its 200 and SSE headers at once,
// then an SSE comment line every ProgressEvery until the engine answers:
// ": LABEL, 12 s" (the time waited), or ": LABEL" for a note that says
// the load's progress itself.
type Progress interface {
	Progress(model string) (note ProgressNote, ok bool)
}

// ProgressNote is what a request waiting for a wake is told.
type ProgressNote struct {
	// Label says what the request waits for ("waking b"), or how far the
	// load got ("b loading 43 % (7.1 of 16.4 GiB), about 12 s left").
	Label string
	// Measured: Label is the load's progress, sent as it is.
	Measured bool
}

// Defaults of the wake progress timing.
const (
	DefaultProgressAfter = 3 * time.Second
	DefaultProgressEvery = 5 * time.Second
)

// admitWithProgress is Admit for a streaming request to a model with wake
// progress: while Admit waits, it commits the stream early and sends
// comments. Admit runs on its own goroutine; its result is always awaited.
func (c *call) admitWithProgress(ctx context.Context, p Progress, a lease.Request) (*Ticket, error) {
	type result struct {
		t   *Ticket
		err error
	}
	done := make(chan result, 1)
	var committed atomic.Bool
	go func() {
		t, err := c.g.models.Admit(context.WithValue(ctx, committedKey{}, &committed), a)
		done <- result{t, err}
	}()
	after, every := c.g.opts.ProgressAfter, c.g.opts.ProgressEvery
	if after <= 0 {
		after = DefaultProgressAfter
	}
	if every <= 0 {
		every = DefaultProgressEvery
	}
	tick := time.NewTimer(after)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return r.t, r.err
		case <-tick.C:
			committed.Store(true)
			note, _ := p.Progress(a.Model)
			c.w.progress(note.comment(c.g.now().Sub(c.start)))
			tick.Reset(every)
		}
	}
}

// comment is the SSE comment of n for a request that waited so far.
func (n ProgressNote) comment(waited time.Duration) string {
	if n.Measured {
		return ": " + n.Label + "\n\n"
	}
	return fmt.Sprintf(": %s, %d s\n\n", n.Label, int(waited.Seconds()))
}

type committedKey struct{}

// Committed reports whether the answer of the request being admitted
// within ctx has started: its stream was committed early for wake
// progress, and the client has its first bytes. Such a request is not
// sent elsewhere (overflow, docs/remote.md): a stream moves only before
// its first byte.
func Committed(ctx context.Context) bool {
	f, _ := ctx.Value(committedKey{}).(*atomic.Bool)
	return f != nil && f.Load()
}

// progress sends an SSE comment, committing the stream (200, SSE headers)
// first if it is not yet. A failed write is left to the next write to see.
func (w *recorder) progress(comment string) {
	if !w.early {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no") // nginx in front must not hold the comments back
		w.WriteHeader(http.StatusOK)
		w.early = true
	}
	_, _ = w.Write([]byte(comment))
	_ = w.rc.Flush()
}

// maxErrorEvent bounds an error answer turned into an event.
const maxErrorEvent = 64 << 10

// endEarly finishes a stream committed early whose answer was not a 200
// (a refusal, a timeout, the engine's error): the client gets it as an
// OpenAI-shaped error event, the status having been sent already.
func (w *recorder) endEarly() {
	if !w.early || w.lateStatus == 0 {
		return
	}
	body := bytes.TrimSpace(w.lateBody)
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) != nil || probe["error"] == nil {
		b, _ := json.Marshal(errorBody{Error: errorDetail{Message: fmt.Sprintf("the engine answered %d", w.lateStatus),
			Type: "server_error", Code: "upstream_error"}})
		body = b
	} else {
		var compact bytes.Buffer
		if json.Compact(&compact, body) == nil {
			body = compact.Bytes()
		}
	}
	w.lateStatus = 0 // what follows goes out as is
	_, _ = w.Write(append(append([]byte("data: "), body...), '\n', '\n'))
	_ = w.rc.Flush()
}
