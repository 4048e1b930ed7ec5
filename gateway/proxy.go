package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/internal/h1"
	"github.com/napd/napd/internal/mono"
)

// maxStored bounds a response captured for idempotent replays; a larger
// one is not remembered (its retry runs again).
const maxStored = 1 << 20

// send sends out, the outbound request of c, to the ticket's engine
// and streams the answer to the client. It does what httputil.ReverseProxy
// did for these requests, without what napd has no use for (a Request
// clone, header copies, per-request hooks): out is built by outbound,
// the answer's headers are handed on without copying their values, and
// the in-memory body goes to the transport as it is, so it leaves in one
// write with the head.
func (c *call) send(ctx context.Context, out *http.Request) {
	resp, head, err := c.roundTrip(out, c.passesHead())
	if c.trace.Got1xxResponse != nil {
		c.traceMu.Lock()
		c.traceDone = true
		c.traceMu.Unlock()
	}
	if err != nil {
		c.failed(ctx, err)
		return
	}
	var f fields = h1.HeaderFields(resp.Header)
	if head != nil {
		f = head
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Only an upgrade request (g.upgrades) may be switched.
		_ = c.answer(resp, f)
		_ = resp.Body.Close()
		c.failed(ctx, fmt.Errorf("backend tried to switch protocol %q when %q was requested", upgradeType(resp.Header), ""))
		return
	}
	removeHopByHop(f)
	if err := c.answer(resp, f); err != nil {
		_ = resp.Body.Close()
		c.failed(ctx, err)
		return
	}
	stream := resp.ContentLength == -1 || isEventStream(f.Get("Content-Type"))
	f = c.handOver(resp, head, f)
	// The Trailer header is not in the transport's answer: it is
	// announced from the trailers the answer declared.
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		f.Add("Trailer", strings.Join(keys, ", "))
	}
	c.w.WriteHeader(resp.StatusCode)
	if err := c.copyAnswer(resp, stream); err != nil {
		defer resp.Body.Close()
		// Mid-answer, all that is left is to cut the client's connection,
		// under a server that recovers the panic (as ReverseProxy does).
		if ctx.Value(http.ServerContextKey) == nil {
			c.g.log.Debug("copy of the engine's answer failed", slog.Any("error", err))
			return
		}
		panic(http.ErrAbortHandler)
	}
	_ = resp.Body.Close() // now: it fills resp.Trailer
	if len(resp.Trailer) > 0 {
		// Chunked, so the trailers can follow (a short answer would
		// otherwise go out with a Content-Length).
		_ = c.w.rc.Flush()
	}
	prefix := ""
	if len(resp.Trailer) != announced {
		prefix = http.TrailerPrefix
	}
	for k, vv := range resp.Trailer {
		for _, v := range vv {
			f.Add(prefix+k, v)
		}
	}
}

// fields is an answer's header as the proxy reads and edits it: the
// engine's answer's h1.Head, passed on as it came, or an http.Header.
// Names are canonical.
type fields interface {
	Get(k string) string
	Values(k string) []string
	Del(k string)
	DelFunc(drop func(k string) bool)
	Set(k, v string)
	Add(k, v string)
}

// headTaker is a ResponseWriter that takes a header handed over (napd's
// h1 server's).
type headTaker interface {
	TakeHeader(h http.Header) bool
	TakeHead(h *h1.Head) bool
}

// passesHead reports whether the engine's answer is read as an h1.Head,
// to be handed over to the client's answer as it is (handOver): sent by
// napd's h1 Transport, answered by napd's h1 Server, and its fields not
// needed afterwards (a captured answer keeps them) nor the body changed
// (a renamed model's), nor its status already sent (early).
func (c *call) passesHead() bool {
	_, ok := c.w.ResponseWriter.(headTaker)
	return ok && sentByH1(c.ticket) && c.served == "" && !c.w.capture && !c.w.early
}

// handOver hands the engine's answer's fields over to the client's
// answer, where nothing asked for its header yet, and returns them as
// the client's answer has them: as the Head they came in, or else as an
// http.Header. napd's h1 Transport (and net/http's it hands some
// requests to) reads names in canonical form, so the header is what
// copying it field by field would make, without that header's two
// allocations. Nothing reads the engine's header after.
func (c *call) handOver(resp *http.Response, head *h1.Head, f fields) fields {
	t, ok := c.w.ResponseWriter.(headTaker)
	if head != nil {
		// Trailers the answer declares need the header (TakeHead's
		// refusals are the server's).
		if ok && len(resp.Trailer) == 0 && t.TakeHead(head) {
			return f
		}
		resp.Header = head.Header()
	}
	if ok && sentByH1(c.ticket) && t.TakeHeader(resp.Header) {
		return h1.HeaderFields(resp.Header)
	}
	h := c.w.Header()
	for k, vv := range resp.Header {
		addValues(h, k, vv)
	}
	return h1.HeaderFields(h)
}

// headerValue is h.Get(k) for a canonical k, as every key napd asks for is: Get
// would make k canonical again, a scan of it (a quarter of a lookup's
// cost; about ten lookups per request).
func headerValue(h http.Header, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// addValues adds vv to h's values of k, as Header.Add does each. A key h
// does not have gets vv itself rather than a copy, capped at its length
// so that a later Add there cannot write into the engine's header.
func addValues(h http.Header, k string, vv []string) {
	k = textproto.CanonicalMIMEHeaderKey(k)
	if have, ok := h[k]; ok {
		h[k] = append(have, vv...)
	} else {
		h[k] = vv[:len(vv):len(vv)]
	}
}

// copyAnswer copies the answer's body to the client. A stream (SSE, or of
// unknown length) has its headers and each write flushed at once; an
// answer of known length is not flushed per write (a flush would send
// its headers in a write of their own: docs/bench.md).
func (c *call) copyAnswer(resp *http.Response, stream bool) error {
	if stream {
		_ = c.w.rc.Flush()
	}
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	buf := *bp
	for {
		nr, rerr := resp.Body.Read(buf)
		if rerr != nil && rerr != io.EOF && rerr != context.Canceled {
			c.g.log.Debug("read error during the copy of the engine's answer", slog.Any("error", rerr))
		}
		if nr > 0 {
			nw, werr := c.w.Write(buf[:nr])
			if stream {
				_ = c.w.rc.Flush()
			}
			if werr != nil {
				return werr
			}
			if nw != nr {
				return io.ErrShortWrite
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// traced is ctx with c's trace, which hands a 1xx answer the transport
// reports (net/http's; napd's h1 drops interim answers: see sentByH1) to
// the client, as ReverseProxy does.
func (c *call) traced(ctx context.Context) context.Context {
	c.trace.Got1xxResponse = c.interim
	return httptrace.WithClientTrace(ctx, &c.trace)
}

// isEventStream reports whether the media type of ct is SSE's, as
// mime.ParseMediaType reads it (without the map of parameters it makes).
func isEventStream(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// interim hands a 1xx answer to the client, unless the round trip is over
// (the transport may report one late, from its own goroutine).
func (c *call) interim(code int, header textproto.MIMEHeader) error {
	c.traceMu.Lock()
	defer c.traceMu.Unlock()
	if c.traceDone {
		return nil
	}
	h := c.w.Header()
	for k, vv := range header {
		addValues(h, k, vv)
	}
	c.w.WriteHeader(code)
	// A 1xx answer's headers are its own, not the final answer's.
	clear(h)
	return nil
}

// outbound makes out, a shallow copy of the client's request in, the
// request for the engine: its URL and headers are out's own. What
// ReverseProxy (with SetURL and SetXForwarded) did to them is done here
// in one pass over in's headers, whose values are shared, not copied
// (capped at their length, and nothing changes a value in place). own:
// in's header map becomes out's, edited (nothing reads in's header once
// the request is made; called once per call); else out gets a map of its
// own.
func (c *call) outbound(out, in *http.Request, own bool) {
	u := &c.outURL
	*u = *in.URL
	u.Scheme, u.Host = c.ticket.Target.Scheme, c.ticket.Target.Host
	u.Path, u.RawPath = joinURLPath(c.ticket.Target, c.path, c.rawPath)
	q := cleanQuery(in.URL.RawQuery)
	if tq := c.ticket.Target.RawQuery; tq == "" || q == "" {
		q = tq + q
	} else {
		q = tq + "&" + q
	}
	if c.served != "" && c.byQuery {
		v, _ := url.ParseQuery(q)
		v.Set("model", c.served)
		q = v.Encode()
	}
	u.RawQuery = q
	out.URL, out.Host, out.Close = u, "", false

	// Hop-by-hop headers and those named in Connection are the client's
	// link's alone; forwarding headers are napd's to set.
	var named []string
	for f := range tokens(in.Header["Connection"]) {
		named = append(named, http.CanonicalHeaderKey(f))
	}
	trailers := hasToken(in.Header["Te"], "trailers")
	var h http.Header
	if own && in.Header != nil {
		// Edited in place: one map and its groups less per request.
		h = in.Header
		for k := range h {
			if c.dropped(k) || slices.Contains(named, k) {
				delete(h, k)
			}
		}
	} else {
		h = make(http.Header, len(in.Header)+3)
		for k, vv := range in.Header {
			if c.dropped(k) || slices.Contains(named, k) {
				continue
			}
			h[k] = vv[:len(vv):len(vv)]
		}
	}
	// Backends that care may send trailers when the client said it takes them.
	if trailers {
		h["Te"] = teTrailers
	}
	fwd := &c.forwarded
	fwd[0] = in.Host
	h["X-Forwarded-Host"] = fwd[:1:1]
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		fwd[1] = ip
		h["X-Forwarded-For"] = fwd[1:2:2]
	}
	if in.TLS == nil {
		h["X-Forwarded-Proto"] = protoHTTP
	} else {
		h["X-Forwarded-Proto"] = protoHTTPS
	}
	if _, ok := h["User-Agent"]; !ok {
		// None rather than Go's default.
		h["User-Agent"] = noUserAgent
	}
	out.Header = h
}

// Shared header values: transports only read them.
var (
	teTrailers  = []string{"trailers"}
	protoHTTP   = []string{"http"}
	protoHTTPS  = []string{"https"}
	noUserAgent = []string{""}
)

// dropped reports whether the client's header k stays out of the engine's
// request.
func (c *call) dropped(k string) bool {
	if slices.Contains(hopByHop, k) {
		return true
	}
	switch k {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	case "Cookie":
		// Cookies of whatever else shares the host name (a web UI on
		// localhost) are no engine's business.
		return true
	case "Authorization", "X-Api-Key":
		// napd's key is for napd, never for the engine.
		return c.g.opts.APIKeys != nil
	case "Accept-Encoding":
		// A mapped answer must come uncompressed.
		return c.served != ""
	}
	return false
}

// hopByHop are the headers of one link alone, dropped both ways besides
// those the Connection header names.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopByHop(h fields) {
	for f := range tokens(h.Values("Connection")) {
		h.Del(textproto.CanonicalMIMEHeaderKey(f))
	}
	h.DelFunc(func(k string) bool { return slices.Contains(hopByHop, k) })
}

// hasToken reports whether a comma-separated list in vv holds token, in
// any case.
func hasToken(vv []string, token string) bool {
	for f := range tokens(vv) {
		if strings.EqualFold(f, token) {
			return true
		}
	}
	return false
}

// tokens yields the items of the comma-separated lists in vv, trimmed,
// the empty ones left out.
func tokens(vv []string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, v := range vv {
			for f := range strings.SplitSeq(v, ",") {
				if f = textproto.TrimString(f); f != "" && !yield(f) {
					return
				}
			}
		}
	}
}

// upgradeType is the protocol a request or answer switches to, or "".
func upgradeType(h http.Header) string {
	if !hasToken(h["Connection"], "upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// joinURLPath is target's path followed by the request's, as
// ReverseProxy's SetURL joins them.
func joinURLPath(target *url.URL, path, rawPath string) (string, string) {
	if target.RawPath == "" && rawPath == "" {
		return joinSlash(target.Path, path), ""
	}
	b := url.URL{Path: path, RawPath: rawPath}
	apath, bpath := target.EscapedPath(), b.EscapedPath()
	aslash, bslash := strings.HasSuffix(apath, "/"), strings.HasPrefix(bpath, "/")
	switch {
	case aslash && bslash:
		return target.Path + path[1:], apath + bpath[1:]
	case !aslash && !bslash:
		return target.Path + "/" + path, apath + "/" + bpath
	}
	return target.Path + path, apath + bpath
}

func joinSlash(a, b string) string {
	aslash, bslash := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/")
	switch {
	case aslash && bslash:
		return a + b[1:]
	case !aslash && !bslash:
		return a + "/" + b
	}
	return a + b
}

// maxQueryParams is ReverseProxy's bound on a query it passes on as it is.
const maxQueryParams = 10000

// cleanQuery is the query as ReverseProxy passes it on: re-encoded, which
// drops what cannot be parsed, when it has a ';', a bad escape or too
// many parameters; as it is otherwise.
func cleanQuery(s string) string {
	reencode := func(s string) string {
		v, _ := url.ParseQuery(s)
		return v.Encode()
	}
	if strings.Count(s, "&")+1 > maxQueryParams {
		return reencode(s)
	}
	for i := 0; i < len(s); {
		switch s[i] {
		case ';':
			return reencode(s)
		case '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return reencode(s)
			}
			i += 3
		default:
			i++
		}
	}
	return s
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// answer prepares the engine's answer for the client (ReverseProxy's
// ModifyResponse).
// f is its header.
func (c *call) answer(resp *http.Response, f fields) error {
	if resp.StatusCode == http.StatusServiceUnavailable && !refusesBeforeWork(c.ticket.Transport) {
		// napd's own 503 promises that no engine saw the request,
		// so a balancer may retry it on another host. An engine's
		// 503 may come after work began: it goes out as 502.
		resp.StatusCode, resp.Status = http.StatusBadGateway, "502 Bad Gateway"
		f.Set(HeaderEngineStatus, "503")
	}
	c.setModelHeaders(f)
	c.w.now = c.g.now
	if c.corsAllowed {
		dropEngineCORS(f)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return nil
	}
	c.watched = watchedBody{ReadCloser: resp.Body, c: c, end: endingOf(resp, f)}
	resp.Body = &c.watched
	if c.served != "" {
		return c.mapAnswer(resp)
	}
	return nil
}

// failed answers a request the engine's answer did not reach (transport
// error) or could not be handed on.
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
		c.fail(http.StatusGatewayTimeout, "timeout", "the engine of model "+c.model+" did not answer within the request deadline")
	case ctxErr != nil:
		// The client left (or the server is stopping): not an error.
		c.gone = true
	default:
		c.fault = faultOf(err)
		c.g.log.Warn("engine connection failed", slog.String("model", c.model), slog.String("fault", c.fault.String()), slog.Any("error", err))
		c.fail(http.StatusBadGateway, "engine_unreachable", c.fault.message(c.model))
	}
}

// newUpgrades builds the ReverseProxy that serves the rare requests that
// ask for a protocol upgrade (a 101 answer hijacks the client's connection
// and copies both ways): send does not. It makes the same outbound
// request and handles the answer and errors alike; the call is in the
// request's context.
func (g *Gateway) newUpgrades() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			callOf(pr.In.Context()).outbound(pr.Out, pr.In, false)
			pr.Out.Header.Set("Connection", "Upgrade")
			pr.Out.Header.Set("Upgrade", upgradeType(pr.In.Header))
		},
		Transport:  callTransport{},
		BufferPool: bufferPool{},
		ErrorLog:   slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ModifyResponse: func(resp *http.Response) error {
			return callOf(resp.Request.Context()).answer(resp, h1.HeaderFields(resp.Header))
		},
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, err error) {
			callOf(r.Context()).failed(r.Context(), err)
		},
	}
}

// callTransport is the upgrade proxy's transport: the call's roundTrip.
type callTransport struct{}

func (callTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, _, err := callOf(req.Context()).roundTrip(req, false)
	return resp, err
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
//
// asHead: an answer napd's h1 Transport reads comes with its fields as an
// h1.Head, not in its Header (h1's RoundTripHead).
func (c *call) roundTrip(req *http.Request, asHead bool) (*http.Response, *h1.Head, error) {
	for n := 0; ; n++ {
		rt := c.ticket.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		var resp *http.Response
		var head *h1.Head
		var err error
		if t, ok := rt.(*h1.Transport); ok && asHead {
			resp, head, err = t.RoundTripHead(req)
		} else {
			resp, err = rt.RoundTrip(req)
		}
		if err == nil || n == maxReroutes || c.ticket.Reroute == nil || faultOf(err) != FaultRefused || req.Context().Err() != nil {
			return resp, head, err
		}
		c.g.log.Info("engine refused the connection: the request waits for the next engine instance",
			slog.String("model", c.model), slog.Any("error", err))
		t, rerr := c.ticket.Reroute(req.Context())
		if rerr != nil {
			return nil, nil, rerr
		}
		c.wake += t.WakeWait
		t.Done, t.Reroute = c.ticket.Done, c.ticket.Reroute
		c.ticket = t
		if req, err = retarget(req, t.Target); err != nil {
			return nil, nil, err
		}
	}
}

// retarget is req for another engine instance (another port on loopback).
func retarget(req *http.Request, target *url.URL) (*http.Request, error) {
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host = target.Scheme, target.Host
	if mb, ok := req.Body.(*h1.MemBody); ok {
		// The refused try is over with it.
		mb.Rewind()
	} else if req.GetBody != nil {
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

func endingOf(resp *http.Response, f fields) *ending {
	if resp.ContentLength >= 0 || slices.Contains(resp.TransferEncoding, "chunked") {
		return nil // framed: a cut shows as a read error
	}
	mt, _, _ := mime.ParseMediaType(f.Get("Content-Type"))
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
	rc       http.ResponseController // a value: one allocation less per request
	timeout  time.Duration
	extended time.Duration // when the write deadline was last moved (mono.Now)
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
	// extended is set back so that the first extend moves the deadline.
	*w = recorder{ResponseWriter: rw, rc: *http.NewResponseController(rw), timeout: timeout, extended: -timeout}
	w.extend()
}

// extend gives the connection another write timeout from now. Called
// before each write, it bounds how long one write may block on a client
// that stopped reading (a stream's chunks may be far apart: the bound is
// per write, like nginx's send_timeout). It also covers what net/http
// writes after the handler returns. A deadline moved less than
// timeout/extendSlack ago is left: each write still gets the timeout,
// less that slack (60 s: 59.06 s), and a request's head and small answer,
// or a stream's close chunks, move it once instead of at each write (each
// move takes the connection's lock and resets a runtime timer).
func (w *recorder) extend() {
	now := mono.Now()
	if now-w.extended < w.timeout/extendSlack {
		return
	}
	w.extended = now
	// An error means no real connection underneath (a test recorder).
	_ = w.rc.SetWriteDeadline(mono.Time(now + w.timeout))
}

// extendSlack: a write deadline is moved again once timeout/extendSlack
// has passed.
const extendSlack = 64

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
	HeaderQueueDepth, HeaderWakeMs, HeaderReplayed,
}

func storedHeader(h http.Header) http.Header {
	s := h.Clone()
	for _, k := range perReply {
		s.Del(k)
	}
	return s
}
