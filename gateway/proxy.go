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
)

// maxStored bounds a response captured for idempotent replays; a larger
// one is not remembered (its retry runs again).
const maxStored = 1 << 20

// newProxy builds the one ReverseProxy every request goes through; the
// per-request target and transport come from the call in the context.
func (g *Gateway) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			c := callOf(pr.In.Context())
			pr.Out.URL.Path, pr.Out.URL.RawPath = c.path, c.rawPath
			pr.SetURL(c.ticket.Target)
			pr.SetXForwarded()
			if g.opts.APIKeys != nil {
				// napd's key is for napd, never for the engine.
				pr.Out.Header.Del("Authorization")
				pr.Out.Header.Del("X-Api-Key")
			}
			if c.served != "" {
				// The answer is mapped back, so it must come uncompressed.
				pr.Out.Header.Del("Accept-Encoding")
				if c.byQuery {
					q := pr.Out.URL.Query()
					q.Set("model", c.served)
					pr.Out.URL.RawQuery = q.Encode()
				}
			}
			// Cookies of whatever else shares the host name (a web UI on
			// localhost) are no engine's business.
			pr.Out.Header.Del("Cookie")
		},
		Transport: ticketTransport{},
		// 0, not -1: ReverseProxy flushes every write of a stream (SSE, or
		// no Content-Length) anyway, and a FlushInterval of -1 would cost
		// each answer of known length a timer goroutine that flushes its
		// headers in a write of their own (measured: docs/bench.md).
		FlushInterval: 0,
		BufferPool:    bufferPool{},
		ErrorLog:      slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ModifyResponse: func(resp *http.Response) error {
			c := callOf(resp.Request.Context())
			if resp.StatusCode == http.StatusServiceUnavailable && !refusesBeforeWork(c.ticket.Transport) {
				// napd's own 503 promises that no engine saw the request,
				// so a balancer may retry it on another host. An engine's
				// 503 may come after work began: it goes out as 502.
				resp.StatusCode, resp.Status = http.StatusBadGateway, "502 Bad Gateway"
				resp.Header.Set(HeaderEngineStatus, "503")
			}
			c.setModelHeaders(resp.Header)
			c.w.now = g.now
			if c.corsAllowed {
				dropEngineCORS(resp.Header)
			}
			if resp.StatusCode == http.StatusSwitchingProtocols {
				return nil
			}
			resp.Body = &watchedBody{ReadCloser: resp.Body, c: c, end: endingOf(resp)}
			if c.served != "" {
				return c.mapAnswer(resp)
			}
			return nil
		},
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, err error) {
			c := callOf(r.Context())
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
			switch ctxErr := r.Context().Err(); {
			case errors.As(err, &ref):
				c.refused(err) // a rerouted request the model could not take
			case errors.Is(ctxErr, context.DeadlineExceeded):
				c.fail(http.StatusGatewayTimeout, "timeout", "the engine of model "+c.model+" did not answer within the request deadline")
			case ctxErr != nil:
				// The client left (or the server is stopping): not an error.
				c.gone = true
			default:
				c.fault = faultOf(err)
				g.log.Warn("engine connection failed", slog.String("model", c.model), slog.String("fault", c.fault.String()), slog.Any("error", err))
				c.fail(http.StatusBadGateway, "engine_unreachable", c.fault.message(c.model))
			}
		},
	}
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

// ticketTransport sends each request with its ticket's transport. A
// request whose connection was refused never reached the engine: it is
// handed back to the model (Ticket.Reroute) to wait for the next verified
// engine instance within its deadline, instead of failing with 502.
type ticketTransport struct{}

// maxReroutes bounds how often one request is handed back.
const maxReroutes = 3

func (ticketTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c := callOf(req.Context())
	if req.GetBody != nil && req.Body != nil {
		// A body read whole (GetBody set) comes wrapped by ReverseProxy in
		// a reader net/http does not know is in memory, so it would send
		// the engine the headers in a write of their own before the body:
		// a fresh copy goes out with them in one.
		if body, err := req.GetBody(); err == nil {
			whole := *req
			whole.Body = body
			req = &whole
		}
	}
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
// cut by the engine or the deadline is never reported as complete. An
// answer whose end is the engine closing the connection (end != nil) is
// checked at that end: an engine that dies ends it the same way.
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
		b.cutShort()
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
	if err != nil && err != io.EOF {
		if n > 0 { // the proxy writes these first, then sees the error
			b.failed = err
			return n, nil
		}
		b.cutShort()
	}
	return n, err
}

// cutShort sends the client what it has of an answer that failed: the
// proxy buffers an answer of known length (no flush per write), and its
// abort would otherwise close the connection with the buffer unsent, the
// status included, so the client could not tell a cut answer from none.
func (b *watchedBody) cutShort() { _ = b.c.w.rc.Flush() }

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
// the first write error, bounds each write by the write timeout and, for
// idempotent requests, captures the response up to maxStored.
type recorder struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	status  int
	err     error
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

func newRecorder(w http.ResponseWriter, timeout time.Duration) *recorder {
	r := &recorder{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
	r.extend()
	return r
}

// extend gives the connection another write timeout from now. Called
// before each write, it bounds how long one write may block on a client
// that stopped reading (a stream's chunks may be far apart: the bound is
// per write, like nginx's send_timeout). It also covers what net/http
// writes after the handler returns.
func (w *recorder) extend() {
	// An error means no real connection underneath (a test recorder).
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
}

// Unwrap lets http.ResponseController reach Flush and SetReadDeadline.
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

// stored is the captured response, or nil when it was too large or is
// not a success: only a complete 2xx is worth replaying, a retry of a
// failure must run again.
func (w *recorder) stored() *StoredResponse {
	if w.overflow || w.status < 200 || w.status > 299 {
		return nil
	}
	return &StoredResponse{Status: w.status, Header: w.header, Body: w.body}
}

// perReply are headers that describe one reply, not the response itself:
// a replay sets its own.
var perReply = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
	HeaderQueueDepth, HeaderWakeMs, HeaderReplayed,
}

func storedHeader(h http.Header) http.Header {
	s := h.Clone()
	for _, k := range perReply {
		s.Del(k)
	}
	return s
}
