package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/napd/napd/agent/lease"
)

// maxStored bounds a response captured for idempotent replays; a larger
// one is not remembered (its retry runs again).
const maxStored = 1 << 20

// newProxy builds the one forwarding path of every request to an HTTP
// engine (and to a ZMQ worker, whose link is a RoundTripper too), upgrades
// included: net/http's ReverseProxy, which drops hop-by-hop headers both
// ways (and those Connection names), keeps TE: trailers, joins the URL,
// cleans the query, adds no User-Agent, passes trailers and 1xx answers on
// and switches protocols on a 101. What napd adds are its hooks, each
// finding its request's call in the request's context: the engine's
// request (rewrite), the engine's answer (answer), a failure (failed), and
// the round trip itself (roundTrip: the ticket's transport, and a reroute
// when the engine instance had gone).
func (g *Gateway) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { callOf(pr.In.Context()).rewrite(pr) },
		Transport: callTransport{},
		// No flush interval: ReverseProxy flushes every write of an event
		// stream or of an answer of unknown length itself, as each chunk
		// must leave as it comes, and an answer of known length leaves
		// with its head in one write when the handler ends. A negative
		// interval would flush every answer's head at once from a timer's
		// goroutine (time.AfterFunc(-1)), a write and a thread switch of
		// its own: ~150 µs of napd's CPU per request on llama-server.
		FlushInterval: 0,
		BufferPool:    bufferPool{},
		ErrorLog:      slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ModifyResponse: func(resp *http.Response) error {
			return callOf(resp.Request.Context()).answer(resp)
		},
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, err error) {
			callOf(r.Context()).failed(r.Context(), err)
		},
	}
}

// rewrite makes the engine's request of the client's (ReverseProxy's
// Rewrite, which has already dropped hop-by-hop and forwarding headers and
// cleaned the query): the engine's path and URL, napd's forwarding
// headers, the headers that are not the engine's business dropped, and the
// body as napd read it.
func (c *call) rewrite(pr *httputil.ProxyRequest) {
	out := pr.Out
	out.URL.Path, out.URL.RawPath = c.path, c.rawPath
	pr.SetURL(c.ticket.Target)
	remote := c.ticket.Remote
	if remote == nil {
		pr.SetXForwarded()
	}
	served := c.served
	if served != "" && c.byQuery {
		v, _ := url.ParseQuery(out.URL.RawQuery)
		v.Set("model", served)
		out.URL.RawQuery = v.Encode()
		served = "" // the body is not renamed
	}
	h := out.Header
	// Cookies of whatever else shares the host name (a web UI on
	// localhost) are no engine's business; napd read the body already,
	// so the client's Expect was answered by napd.
	h.Del("Cookie")
	h.Del("Expect")
	h.Del(HeaderPriority) // napd's: the engine's own field is engine_priority's
	if c.g.opts.APIKeys != nil {
		// napd's key is for napd, never for the engine.
		h.Del("Authorization")
		h.Del("X-Api-Key")
	}
	if remote != nil {
		remote.setCredential(h)
	}
	if c.served != "" {
		// A mapped answer must come uncompressed.
		h.Del("Accept-Encoding")
	}
	out.TransferEncoding = nil
	e := bodyEdit{served: served}
	if c.ticket.EnginePriority && c.ticket.Class.Set() {
		e.priority, e.setPriority = c.ticket.Class.Engine(), true
	}
	c.up.attach(out, e)
}

// answer prepares the engine's answer for the client (ReverseProxy's
// ModifyResponse): an engine's 503 goes out as 502, napd's headers are
// added, the engine's CORS headers dropped where napd set its own, and
// the body is watched (usage, a cut) and, for served_name, mapped.
func (c *call) answer(resp *http.Response) error {
	h := resp.Header
	if resp.StatusCode == http.StatusServiceUnavailable && !refusesBeforeWork(c.ticket.Transport) {
		// napd's own 503 promises that no engine saw the request,
		// so a balancer may retry it on another host. An engine's
		// 503 may come after work began: it goes out as 502.
		resp.StatusCode, resp.Status = http.StatusBadGateway, "502 Bad Gateway"
		h.Set(HeaderEngineStatus, "503")
	}
	if c.ticket.Remote != nil {
		// A remote napd's queue is not this one's.
		h.Del(HeaderQueueDepth)
	}
	if by := c.ticket.ServedBy; by != "" {
		h.Set(HeaderServedBy, by)
	}
	c.setModelHeaders(h)
	c.w.now = c.g.now
	if c.corsAllowed {
		dropEngineCORS(h)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The proxy hijacks the connection: no WriteHeader to see it.
		c.w.status = resp.StatusCode
		return nil
	}
	// From here the answer is the engine's, written as it comes: a client
	// that stops reading it is cut at the request's deadline (or after
	// write_timeout, whichever comes first), not only after write_timeout.
	c.w.cutAt(c.deadlineAt)
	c.watched = watchedBody{ReadCloser: resp.Body, c: c, end: endingOf(resp)}
	resp.Body = &c.watched
	if c.served != "" {
		return c.mapAnswer(resp)
	}
	return nil
}

// failed answers a request the engine's answer did not reach (transport
// error) or could not be handed on (ReverseProxy's ErrorHandler).
func (c *call) failed(ctx context.Context, err error) {
	c.proxyErr = err
	if up := c.uploadErr.Load(); up != nil {
		// The rest of a streamed upload failed: too large, too
		// slow, or the client left. The transport returns only
		// after its body reader stopped, so a failed read is
		// known here; and it tells the cause apart where the
		// context cannot (a read deadline on the client's
		// connection also cancels the request's context).
		c.gone = !c.bodyFailed(up.err, up.idle)
		return
	}
	// Only the request's own deadline is a 504: a connect timeout
	// (net's timeout error also reads as DeadlineExceeded) is the
	// engine's fault.
	var ref *Refusal
	switch ctxErr := ctx.Err(); {
	case errors.As(err, &ref):
		c.refused(err) // a rerouted request the model could not take
	case errors.Is(ctxErr, context.DeadlineExceeded):
		c.fail(http.StatusGatewayTimeout, "timeout", c.upstreamName()+" did not answer within the request deadline")
	case ctxErr != nil:
		// The client left (or the server is stopping): not an error.
		c.gone = true
	default:
		c.fault = faultOf(err)
		c.g.log.Warn("engine connection failed", slog.String("model", c.model), slog.String("fault", c.fault.String()), slog.Any("error", err))
		msg := c.fault.message(c.upstreamName())
		if c.ticket.Remote != nil {
			if why := remoteFailure(err); why != "" {
				msg += ": " + why
			}
		}
		c.fail(http.StatusBadGateway, "engine_unreachable", msg)
	}
}

// callTransport is the proxy's transport: the call's roundTrip.
type callTransport struct{}

func (callTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return callOf(req.Context()).roundTrip(req)
}

// RefusingTransport is a Ticket.Transport whose 503s are refusals made
// before any work began (a ZMQ worker's "no room", by the engine
// contract): those stay 503. Every other engine's 503 becomes 502.
type RefusingTransport interface {
	http.RoundTripper
	RefusesBeforeWork()
}

func refusesBeforeWork(rt http.RoundTripper) bool {
	_, ok := rt.(RefusingTransport)
	return ok
}

// maxReroutes bounds how often one request is handed back.
const maxReroutes = 3

// roundTrip sends req with its ticket's transport. A request whose
// connection was refused never reached the engine: it is handed back to
// the model (Ticket.Reroute) to wait for the next verified engine instance
// within its deadline, instead of failing with 502.
func (c *call) roundTrip(req *http.Request) (*http.Response, error) {
	for n := 0; ; n++ {
		rt := c.ticket.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		resp, err := rt.RoundTrip(req)
		if err == nil || n == maxReroutes || c.ticket.Reroute == nil || faultOf(err) != FaultRefused || req.Context().Err() != nil {
			return resp, err
		}
		c.g.log.Info("engine refused the connection: the request waits for the next engine instance",
			slog.String("model", c.model), slog.Any("error", err))
		t, rerr := c.ticket.Reroute(req.Context())
		if rerr != nil {
			return nil, rerr
		}
		c.wake += t.WakeWait
		t.Done, t.Reroute = c.ticket.Done, c.ticket.Reroute
		c.ticket = t
		if req, err = retarget(req, t.Target); err != nil {
			return nil, err
		}
	}
}

// retarget is req for another engine instance (another port on loopback).
// A body that cannot be read again (a streamed upload) was not read by
// the refused try: it goes as it is.
func retarget(req *http.Request, target *url.URL) (*http.Request, error) {
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host = target.Scheme, target.Host
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		out.Body = body
	}
	return out, nil
}

// watchedBody remembers a failed read of the engine's response, so a body
// cut by the engine or the deadline is never reported as complete, and
// hands what it reads to the usage scanner. An answer whose end is the
// engine closing the connection (end != nil) is checked at that end: an
// engine that dies ends it the same way.
type watchedBody struct {
	io.ReadCloser
	c   *call
	end *ending
	// failed is a read error held back until the bytes read with it are
	// written to the client.
	failed error
}

// errCut ends the copy of an answer the engine stopped before its end, so
// the client's connection is cut too rather than ended as if complete.
var errCut = errors.New("the engine closed the connection before its answer was complete")

func (b *watchedBody) Read(p []byte) (int, error) {
	if err := b.failed; err != nil {
		return 0, err
	}
	n, err := b.ReadCloser.Read(p)
	if b.end != nil {
		b.end.add(p[:n])
		if err == io.EOF && !b.end.complete() {
			err = errCut
		}
	}
	_, _ = b.c.usage.Write(p[:n])
	if err != nil && err != io.EOF && b.c.bodyErr == nil {
		b.c.bodyErr = err
	}
	if err != nil && err != io.EOF && n > 0 {
		// The proxy writes these first, then sees the error.
		b.failed = err
		return n, nil
	}
	return n, err
}

// ending checks that an answer delimited by the connection's close got to
// its end: an event stream's last event is OpenAI's "data: [DONE]" or
// Anthropic's message_stop, a JSON answer parses. Other content, and JSON
// too large to hold, cannot be checked and count as complete.
type ending struct {
	sse  bool
	tail []byte // an event stream's last bytes
	body []byte // a JSON answer, up to maxStored
	over bool
}

const sseTail = 128

func endingOf(resp *http.Response) *ending {
	if resp.ContentLength >= 0 || slices.Contains(resp.TransferEncoding, "chunked") {
		return nil // framed: a cut shows as a read error
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case mt == "text/event-stream":
		return &ending{sse: true}
	case mt == "application/json":
		return &ending{}
	}
	return nil
}

func (e *ending) add(p []byte) {
	if e.sse {
		e.tail = append(e.tail, p...)
		if len(e.tail) > sseTail {
			e.tail = append(e.tail[:0], e.tail[len(e.tail)-sseTail:]...)
		}
		return
	}
	if e.over || len(e.body)+len(p) > maxStored {
		e.over, e.body = true, nil
		return
	}
	e.body = append(e.body, p...)
}

func (e *ending) complete() bool {
	if e.sse {
		t := bytes.TrimSpace(e.tail)
		return bytes.HasSuffix(t, []byte("data: [DONE]")) || bytes.Contains(t, []byte(`"message_stop"`))
	}
	return e.over || json.Valid(e.body)
}

// bufferPool reuses the proxy's copy buffers: thousands of open streams
// would otherwise each hold a fresh one. An open stream holds its buffer
// until it ends, so it is 8 KiB, not io.Copy's 32 KiB: SSE chunks are far
// smaller, and 10,000 streams hold 80 MiB of buffers instead of 320
// (docs/bench.md).
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 8<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// recorder wraps the client's ResponseWriter: it remembers the status and
// the first write error, bounds each write by the write timeout (and, once
// the answer is a stream or the engine's, by the request's deadline) and,
// for idempotent requests, captures the response up to maxStored.
type recorder struct {
	http.ResponseWriter
	rc       http.ResponseController // a value: one allocation less per request
	timeout  time.Duration
	cut      time.Time // no write may block past it; zero: none
	extended time.Time // when the write deadline was last moved
	status   int
	err      error
	// now, set for an engine's answer, stamps firstByte.
	now       func() time.Time
	firstByte time.Time
	capture   bool
	header    http.Header
	body      []byte
	overflow  bool
	// early: the 200 and SSE headers went out while the request waited
	// (wake progress). A later status other than 200 (lateStatus) is not
	// sent: its body is kept (lateBody) and ends the stream as an error
	// event (endEarly).
	early      bool
	lateStatus int
	lateBody   []byte
}

// init makes w the recorder of rw, in place: it is part of the call.
func (w *recorder) init(rw http.ResponseWriter, timeout time.Duration) {
	*w = recorder{ResponseWriter: rw, rc: *http.NewResponseController(rw), timeout: timeout}
	w.extend()
}

// cutAt makes at (zero: none) the latest any write may block until. Set
// when the answer becomes a stream of its own or the engine's: napd's own
// errors before that (a 504 at the deadline) are still written.
func (w *recorder) cutAt(at time.Time) {
	if w.cut != at {
		w.cut = at
		w.extended = time.Time{}
		w.extend()
	}
}

// extend gives the connection another write timeout from now (no later
// than the cut). Called before each write, it bounds how long one write
// may block on a client that stopped reading (a stream's chunks may be far
// apart: the bound is per write, like nginx's send_timeout). It also
// covers what net/http writes after the handler returns. A deadline moved
// less than timeout/extendSlack ago is left: each write still gets the
// timeout less that slack (60 s: 59.06 s), and a stream's chunks that come
// close together move it once instead of at each write (each move takes
// the connection's lock and resets a timer).
func (w *recorder) extend() {
	now := time.Now()
	if now.Sub(w.extended) < w.timeout/extendSlack {
		return
	}
	w.extended = now
	at := now.Add(w.timeout)
	if !w.cut.IsZero() && w.cut.Before(at) {
		at = w.cut
	}
	// An error means no real connection underneath (a test recorder).
	_ = w.rc.SetWriteDeadline(at)
}

// extendSlack: a write deadline is moved again once timeout/extendSlack
// has passed.
const extendSlack = 64

// Unwrap lets http.ResponseController reach Flush, Hijack and the
// deadlines.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *recorder) WriteHeader(code int) {
	if w.early {
		if code != http.StatusOK && code >= 200 && w.lateStatus == 0 {
			w.lateStatus = code
		}
		return
	}
	// 1xx responses other than 101 are interim; the final status follows.
	w.extend()
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
		if w.capture {
			w.header = storedHeader(w.Header())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(p []byte) (int, error) {
	if w.lateStatus != 0 {
		if len(w.lateBody) < maxErrorEvent {
			w.lateBody = append(w.lateBody, p[:min(len(p), maxErrorEvent-len(w.lateBody))]...)
		}
		return len(p), nil
	}
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.extend()
	if w.now != nil && w.firstByte.IsZero() && len(p) > 0 {
		w.firstByte = w.now()
	}
	n, err := w.ResponseWriter.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	if w.capture && !w.overflow {
		if len(w.body)+n > maxStored {
			w.overflow, w.body = true, nil
		} else {
			w.body = append(w.body, p[:n]...)
		}
	}
	return n, err
}

// FlushError sends what is buffered (ReverseProxy flushes through
// http.ResponseController, which finds this first). A failed flush is a
// failed write: the stream's last bytes did not reach the client.
func (w *recorder) FlushError() error {
	err := w.rc.Flush()
	if err != nil && w.err == nil {
		w.err = err
	}
	return err
}

// stored is the captured response, or nil when it was too large or is
// not a success: only a complete 2xx is worth replaying, a retry of a
// failure must run again.
func (w *recorder) stored() *lease.Stored {
	if w.overflow || w.status < 200 || w.status > 299 {
		return nil
	}
	return &lease.Stored{Status: w.status, Header: w.header, Body: w.body}
}

// perReply are headers that describe one reply, not the response itself:
// a replay sets its own.
var perReply = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
	HeaderQueueDepth, HeaderWakeMs, HeaderReplayed, HeaderPriority,
}

func storedHeader(h http.Header) http.Header {
	s := h.Clone()
	for _, k := range perReply {
		s.Del(k)
	}
	return s
}
