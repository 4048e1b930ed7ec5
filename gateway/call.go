package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/request"
)

// Headers the gateway reads or sets.
const (
	// HeaderRequestTimeout shortens the request's budget ("30s" or "30").
	HeaderRequestTimeout = "X-Request-Timeout"
	// HeaderQueueDepth is the model's queue depth when the reply was sent.
	HeaderQueueDepth = "X-Queue-Depth"
	// HeaderWakeMs is how long the request waited for a wake, in ms.
	HeaderWakeMs = "X-Napd-Wake-Ms"
	// HeaderReplayed marks a response replayed for an Idempotency-Key.
	HeaderReplayed = "X-Napd-Replayed"
	// HeaderIdempotencyKey names a request whose retries join or replay it.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderEngineStatus is the engine's own status when napd sends
	// another: an engine's 503 goes out as 502 with this header at 503.
	HeaderEngineStatus = "X-Napd-Engine-Status"
	// HeaderPriority names a class of [policy] priorities: on a request,
	// the class it asks for (at most its key's); on the answer, the class
	// it ran in.
	HeaderPriority = "X-Napd-Priority"
)

// call is one request on its way through the gateway. The proxy hooks find
// it in the request context; only the handler goroutine touches it.
type call struct {
	g         *Gateway
	w         recorder // part of the call: one allocation less
	start     time.Time
	model     string // "" until resolved
	client    string // API key name
	scope     *Scope // the API key's scope; nil when keys are off
	kind      request.Kind
	stream    bool
	admitted  bool
	wake      time.Duration
	queueWait time.Duration
	class     priority.Class // as the model resolved it, once admitted
	usage     UsageScanner   // token counts of the engine's answer
	cancelled bool           // the response is not complete (left, deadline, engine error)
	replayed  bool
	probe     bool // a balancer's health check: logged at debug whatever it answers

	anthropic   bool // an Anthropic route: errors in Anthropic's shape
	corsAllowed bool // napd set the CORS headers of an allowed origin
	seesArgs    bool // model listings show the engines' command lines (admins)

	// For served_name: the model name or alias the client sent ("" when
	// the request was not routed by a name it carries), whether it came in
	// ?model=, and the engine's name for the model once admitted.
	requested string
	byQuery   bool
	served    string

	// Set for the proxy: where to send the request and with what, and
	// the answer's body (answer): in the call, not allocated apart.
	ticket        *Ticket
	path, rawPath string
	up            upload
	watched       watchedBody
	proxyErr      error // the engine's answer did not come, or could not be handed on
	bodyErr       error // reading the engine's response body
	fault         Fault // the engine's side, for the model layer and the log
	gone          bool  // the client left before the engine answered
	// uploadErr is why reading a streamed upload failed; set by the
	// transport's goroutine.
	uploadErr atomic.Pointer[uploadFailure]
	body      bodyReader // the request body, once opened (openBody)
	whole     wholeBody  // the request body, when read whole
	// The request's deadline (deadline): when it is (zero: none), and
	// the end of its context.
	deadlineAt     time.Time
	cancelDeadline context.CancelFunc
}

type callKey struct{}

func callOf(ctx context.Context) *call { return ctx.Value(callKey{}).(*call) }

// forward reads the body, finds the model (from the body when fromBody),
// asks Models for a slot and proxies the request to path on the engine.
func (c *call) forward(r *http.Request, path, rawPath string, fromBody bool) {
	if c.g.rules.Refused(r.Method, path) {
		c.fail(http.StatusForbidden, "engine_control_refused",
			"engine control endpoint "+path+" is reserved for napd and the operator")
		return
	}
	key := headerValue(r.Header, HeaderIdempotencyKey)
	if len(key) > MaxIdempotencyKey {
		c.fail(http.StatusBadRequest, "invalid_idempotency_key",
			fmt.Sprintf("%s is longer than %d bytes", HeaderIdempotencyKey, MaxIdempotencyKey))
		return
	}
	ctx, ok := c.deadline(r)
	if !ok {
		return
	}
	defer c.endDeadline()
	if boundary, ok := isForm(r); ok {
		c.forwardForm(ctx, r, boundary, path, rawPath, key, fromBody)
		return
	}
	body, ok := c.readBody(ctx, r)
	if !ok {
		return
	}
	fields, err := parseBody(body)
	if errors.Is(err, errAmbiguous) {
		// Whatever the route: napd and the engine must not read two requests.
		c.fail(http.StatusBadRequest, "ambiguous_field", "request body is ambiguous: "+err.Error())
		return
	}
	if fromBody {
		if err != nil {
			c.fail(http.StatusBadRequest, "invalid_json", "request body is not a valid JSON object: "+err.Error())
			return
		}
		if fields.Model == "" {
			c.fail(http.StatusBadRequest, "missing_model", "request body has no \"model\"")
			return
		}
		model, ok := c.resolve(fields.Model)
		if !ok {
			return
		}
		c.model, c.requested = model, fields.Model
	}
	// Off the OpenAI routes a body need not be JSON; stream is then unknown.
	c.stream = err == nil && fields.Stream
	c.path, c.rawPath = path, rawPath
	var whole io.Reader // the fingerprint's, with a key only
	if key != "" {
		whole = bytes.NewReader(body)
	}
	c.whole.b = body
	c.dispatch(ctx, r, &c.whole, key, whole)
}

// dispatch admits and proxies a request whose model, path and stream are
// known, within its key's concurrency limit. whole is the entire body,
// for the idempotency key's fingerprint (unused without a key).
func (c *call) dispatch(ctx context.Context, r *http.Request, up upload, key string, whole io.Reader) {
	asked, ok := c.askedClass(r)
	if !ok || !c.withinQuota() {
		return
	}
	if c.scope != nil {
		if !c.scope.acquire() {
			c.w.Header().Set("Retry-After", "1")
			c.fail(http.StatusTooManyRequests, "key_concurrency_limit",
				fmt.Sprintf("API key %q already has %d requests in flight (its concurrency limit)", c.client, c.scope.Concurrency))
			return
		}
		defer c.scope.release()
	}
	c.kind = kindOf(c.path)
	a := lease.Request{
		Model:          c.model,
		Client:         c.client,
		Kind:           c.kind,
		Stream:         c.stream,
		IdempotencyKey: key,
		Asked:          asked,
		ByName:         c.requested != "",
	}
	if c.scope != nil {
		a.Priority = c.scope.Priority
	}
	if key != "" {
		a.Fingerprint = fingerprint(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, c.model, whole)
	}
	c.admit(ctx, r, up, a)
}

// askedClass reads X-Napd-Priority: the class the request asks for (None
// when it asks none), or 400 for a name that is no class.
func (c *call) askedClass(r *http.Request) (priority.Class, bool) {
	name := headerValue(r.Header, HeaderPriority)
	if name == "" {
		return priority.None, true
	}
	class, err := c.g.opts.Priorities.Parse(name)
	if err != nil {
		c.fail(http.StatusBadRequest, "invalid_priority", HeaderPriority+": "+err.Error())
		return priority.None, false
	}
	return class, true
}

// withinQuota answers 429 quota_exceeded, with Retry-After at the end of
// the quota window, to a key whose use today has reached one of its
// quotas; admin keys have none.
func (c *call) withinQuota() bool {
	q := c.g.opts.Quotas
	if q == nil || !c.scope.Limited() {
		return true
	}
	now := c.g.now()
	used, end := q.Today(c.client, now)
	var msg string
	switch s := c.scope; {
	case s.GPUHoursPerDay > 0 && used.GPUHours >= s.GPUHoursPerDay:
		msg = fmt.Sprintf("API key %q has used %.3f GPU hours today, its gpu_hours_per_day=%g", c.client, used.GPUHours, s.GPUHoursPerDay)
	case s.TokensPerDay > 0 && used.Tokens >= s.TokensPerDay:
		msg = fmt.Sprintf("API key %q has used %d tokens today, its tokens_per_day=%d", c.client, used.Tokens, s.TokensPerDay)
	default:
		return true
	}
	setRetryAfter(c.w.Header(), end.Sub(now))
	c.fail(http.StatusTooManyRequests, "quota_exceeded", msg+"; the quota renews at "+end.Format("2006-01-02 15:04 MST"))
	return false
}

// headerValue is h.Get(k) for a canonical k, as every key napd asks for
// is: Get would make k canonical again.
func headerValue(h http.Header, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// MaxIdempotencyKey bounds an Idempotency-Key (bytes), as Stripe does.
const MaxIdempotencyKey = 255

// fingerprint binds an idempotency key to what it was used for: the same
// key with another method, path, query, model or body is another request.
func fingerprint(method, path, query, model string, body io.Reader) string {
	h := sha256.New()
	for _, s := range []string{method, path, query, model} {
		// Length-prefixed, so no two field lists hash alike.
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	// Reads from memory or the spool's file; a failure there is caught
	// when the same bytes are sent.
	_, _ = io.Copy(h, body)
	return hex.EncodeToString(h.Sum(nil))
}

// upstream serves /upstream/<model>/<path…>: any method, path and query.
func (c *call) upstream(r *http.Request) {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/upstream/")
	nameEsc, pathEsc, _ := strings.Cut(rest, "/")
	// EscapedPath is always a valid escaping, so unescaping cannot fail.
	name, _ := url.PathUnescape(nameEsc)
	model, ok := c.resolve(name)
	if !ok {
		return
	}
	c.model = model
	rawPath := "/" + pathEsc
	path, _ := url.PathUnescape(rawPath)
	c.forward(r, path, rawPath, false)
}

// resolve finds the model a name or alias names, for the request's key: it
// answers 403 (a name the key may not use) or 404 and returns false.
func (c *call) resolve(name string) (string, bool) {
	model, ok := c.g.models.Resolve(name)
	if !c.mayUse(name, model) {
		return "", false
	}
	if !ok {
		c.fail(http.StatusNotFound, "model_not_found", fmt.Sprintf("model %q does not exist", name))
		return "", false
	}
	return model, true
}

// mayUse answers 403 unless the request's key may use the model named
// requested, which resolved to model ("" when no such model exists). A
// denied name gets the same answer whether it exists or not, so a key
// cannot probe for the models it may not use.
func (c *call) mayUse(requested, model string) bool {
	if c.scope.MayUse(requested, model) {
		return true
	}
	c.fail(http.StatusForbidden, "model_not_allowed",
		fmt.Sprintf("API key %q may not use model %q: it may use only models matching %s",
			c.client, requested, strings.Join(c.scope.Models, ",")))
	return false
}

// deadline derives the request's single budget from request_timeout and
// X-Request-Timeout, which may only shorten it; endDeadline ends it.
func (c *call) deadline(r *http.Request) (context.Context, bool) {
	d := c.g.opts.RequestTimeout
	if h := headerValue(r.Header, HeaderRequestTimeout); h != "" {
		hd, err := parseTimeout(h)
		if err != nil {
			c.fail(http.StatusBadRequest, "invalid_request_timeout", err.Error())
			return nil, false
		}
		if d == 0 || hd < d {
			d = hd
		}
	}
	if d == 0 {
		// The server cancels the request's own context when the handler
		// returns.
		return r.Context(), true
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	c.cancelDeadline = cancel
	c.deadlineAt, _ = ctx.Deadline()
	return ctx, true
}

func (c *call) endDeadline() {
	if c.cancelDeadline != nil {
		c.cancelDeadline()
	}
}

// readBody reads the whole body within max_body and the deadline: the
// upload is part of the budget, so a slow client gets 504. Each read also
// waits at most BodyTimeout, deadline or not (408, as nginx's
// client_body_timeout). Memory follows the bytes that arrive, never the
// Content-Length a client announces.
func (c *call) readBody(ctx context.Context, r *http.Request) ([]byte, bool) {
	br, ok := c.openBody(ctx, r)
	if !ok {
		return nil, false
	}
	var buf []byte
	if n := r.ContentLength; n > 0 {
		// One byte more than announced: the read that finds the end
		// needs room, and a body of the announced length is read into a
		// single allocation.
		buf = make([]byte, 0, min(n, initialBody)+1)
	}
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, minBodyRead)
		}
		n, err := br.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			if !c.bodyFailed(err, br.idleBound) {
				c.abort()
			}
			return nil, false
		}
	}
	br.done()
	return buf, true
}

// minBodyRead is the least room a read of a body of unknown length gets.
const minBodyRead = 512

// openBody applies max_body, the deadline and BodyTimeout to the request
// body. A body announced larger than max_body is answered 413 without
// reading a byte of it.
func (c *call) openBody(ctx context.Context, r *http.Request) (*bodyReader, bool) {
	if limit := c.g.opts.MaxBody; limit > 0 && r.ContentLength > limit {
		c.fail(http.StatusRequestEntityTooLarge, "request_too_large",
			fmt.Sprintf("request body is larger than %d bytes", limit))
		return nil, false
	}
	src := r.Body
	if c.g.opts.MaxBody > 0 && r.ContentLength < 0 {
		// A body of announced length ends there; one of unknown length is
		// bounded as it is read. The unwrapped writer lets net/http close
		// the connection after a 413.
		src = http.MaxBytesReader(c.w.ResponseWriter, r.Body, c.g.opts.MaxBody)
	}
	br := &c.body
	*br = bodyReader{src: src, rc: &c.w.rc, idle: c.g.opts.BodyTimeout}
	br.deadline, _ = ctx.Deadline()
	return br, true
}

// bodyFailed answers a failed read of the request body that was too large
// or too slow (idle: the idle bound, not the request's deadline, ran
// out), or whose chunked framing is broken. It reports false, answering
// nothing, for a client that left.
func (c *call) bodyFailed(err error, idle bool) bool {
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooLarge):
		c.fail(http.StatusRequestEntityTooLarge, "request_too_large",
			fmt.Sprintf("request body is larger than %d bytes", tooLarge.Limit))
	case errors.Is(err, os.ErrDeadlineExceeded) && idle:
		c.fail(http.StatusRequestTimeout, "body_timeout",
			fmt.Sprintf("the request body stalled for %s", c.g.opts.BodyTimeout))
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.fail(http.StatusGatewayTimeout, "timeout", "the request body did not arrive within the request deadline")
	case errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &netErr), errors.Is(err, net.ErrClosed),
		errors.Is(err, http.ErrBodyReadAfterClose), errors.Is(err, context.Canceled):
		return false // the client left, or its connection broke
	default:
		// net/http's chunked reader: a chunk size too large or not
		// hex, a chunk without its line end.
		c.fail(http.StatusBadRequest, "invalid_body", "the request body's chunked framing is malformed")
	}
	return true
}

// initialBody is the most a body buffer starts with: enough for most
// requests in one piece, and all an announced-but-unsent body costs.
const initialBody = 64 << 10

// bodyReader sets the connection's read deadline before each read: the
// sooner of the request's deadline and idle from now. As the recorder's
// write deadline (extend), an idle bound set less than idle/extendSlack
// ago is left in place: a read waits at least idle less that slack.
type bodyReader struct {
	src       io.Reader
	rc        *http.ResponseController
	idle      time.Duration
	deadline  time.Time // the request's; zero: none
	set       time.Time // the deadline set; zero: none yet
	idleBound bool      // the deadline set is the idle bound
}

func (b *bodyReader) Read(p []byte) (int, error) {
	next, idle := time.Now().Add(b.idle), true
	if !b.deadline.IsZero() && !next.Before(b.deadline) {
		next, idle = b.deadline, false
	}
	if b.set.IsZero() || idle != b.idleBound || next.Sub(b.set) >= b.idle/extendSlack {
		b.set, b.idleBound = next, idle
		// An error means no real server connection underneath; the read
		// is then bounded by the client alone.
		_ = b.rc.SetReadDeadline(next)
	}
	return b.src.Read(p)
}

// done lifts the read deadline after the body's last byte. Left in
// place, it would fire in the server's background read and look like a
// client disconnect. After a failed read it stays, so net/http's discard
// of the unread body cannot block on a stalled client.
func (b *bodyReader) done() { _ = b.rc.SetReadDeadline(time.Time{}) }

// admit asks Models for a slot and then replays or proxies.
func (c *call) admit(ctx context.Context, r *http.Request, up upload, a lease.Request) {
	asked := c.g.now()
	var t *Ticket
	var err error
	if p, ok := c.g.models.(Progress); ok && a.Stream && !c.anthropic && wantsProgress(p, a.Model) {
		defer c.w.endEarly()
		t, err = c.admitWithProgress(ctx, p, a)
	} else {
		t, err = c.g.models.Admit(ctx, a)
	}
	if err != nil {
		c.refused(err)
		return
	}
	c.admitted = true
	c.class = t.Class
	c.wake = t.WakeWait
	c.queueWait = max(c.g.now().Sub(asked)-t.WakeWait, 0)
	if t.Replay != nil {
		c.replay(t)
		return
	}
	c.proxy(ctx, r, up, t, a.IdempotencyKey != "")
}

func wantsProgress(p Progress, model string) bool {
	_, ok := p.Progress(model)
	return ok
}

// refused answers an Admit error: a Refusal says its own status; a deadline
// is 504; a client that left gets nothing.
func (c *call) refused(err error) {
	var ref *Refusal
	switch {
	case errors.As(err, &ref):
		status := ref.Status
		if status == 0 {
			status = http.StatusServiceUnavailable
		}
		code := ref.Code
		if code == "" {
			code = "model_unavailable"
		}
		retry := ref.RetryAfter
		if status == http.StatusServiceUnavailable && retry <= 0 {
			// A balancer retries a 503 elsewhere; the hint says when
			// this host may take it.
			retry = defaultRetryAfter
		}
		setRetryAfter(c.w.Header(), retry)
		c.fail(status, code, ref.Message)
	case errors.Is(err, context.DeadlineExceeded):
		c.fail(http.StatusGatewayTimeout, "timeout",
			fmt.Sprintf("model %s could not take the request within the request deadline", c.model))
	case errors.Is(err, context.Canceled):
		c.abort()
	default:
		c.g.log.Error("admit failed", slog.String("model", c.model), slog.Any("error", err))
		c.fail(http.StatusInternalServerError, "internal_error", "napd could not admit the request")
	}
}

// defaultRetryAfter is the Retry-After of a 503 whose cause gave none.
const defaultRetryAfter = time.Second

// setRetryAfter sets Retry-After to d in whole seconds, rounded up; d <= 0
// sets nothing.
func setRetryAfter(h http.Header, d time.Duration) {
	if d > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10))
	}
}

// replay writes a stored response for a finished idempotent request.
func (c *call) replay(t *Ticket) {
	// Outcome has nothing to say about a replay: it was complete already.
	defer t.Done(Outcome{})
	c.replayed = true
	h := c.w.Header()
	for k, v := range t.Replay.Header {
		h[k] = append([]string(nil), v...)
	}
	h.Set(HeaderReplayed, "true")
	h.Set("Content-Length", strconv.Itoa(len(t.Replay.Body)))
	c.setModelHeaders(h)
	status := t.Replay.Status
	if status == 0 {
		status = http.StatusOK
	}
	c.w.WriteHeader(status)
	_, _ = c.w.Write(t.Replay.Body)
}

// proxy forwards to the ticket's engine and calls Done once, after the
// last byte (or on the way out of an abort).
func (c *call) proxy(ctx context.Context, r *http.Request, up upload, t *Ticket, capture bool) {
	c.ticket, c.up = t, up
	c.w.capture = capture
	complete := false
	defer func() {
		c.cancelled = !complete
		if c.bodyErr != nil && ctx.Err() == nil {
			// Not the deadline nor the client: the engine stopped.
			c.fault = FaultCut
		}
		out := Outcome{Outcome: lease.Outcome{Cancelled: !complete}, Fault: c.fault}
		if complete && capture {
			out.Response = c.w.stored()
		}
		t.Done(out)
	}()
	if t.ServedName != "" && c.requested != "" {
		c.served = t.ServedName
	}
	// The proxy's hooks find the call in the request's context.
	c.g.proxy.ServeHTTP(&c.w, r.WithContext(context.WithValue(ctx, callKey{}, c)))
	if c.gone {
		c.abort()
	}
	complete = c.proxyErr == nil && c.bodyErr == nil && c.w.err == nil
}

// upload is a request body on its way to the engine.
type upload interface {
	// attach makes it out's body, edited by e.
	attach(out *http.Request, e bodyEdit)
}

// bodyEdit is what napd changes in a request body on its way to the
// engine; the zero value changes nothing.
type bodyEdit struct {
	// served, when not "", replaces the body's model (served_name).
	served string
	// priority is the engine's priority field (engine_priority), set in
	// a JSON body when setPriority.
	priority    int
	setPriority bool
}

// wholeBody is a body read whole: the JSON routes and pass-through. It is
// part of the call, and so is the reader the transport reads it with.
type wholeBody struct {
	b    []byte
	sent memBody
}

// memBody is a body in memory as a transport reads it.
type memBody struct{ bytes.Reader }

func (*memBody) Close() error { return nil }

func (w *wholeBody) attach(out *http.Request, e bodyEdit) {
	body := w.b
	if e.served != "" {
		body = setModel(body, e.served)
	}
	if e.setPriority {
		body = setPriority(body, e.priority)
	}
	out.ContentLength = int64(len(body))
	if len(body) == 0 {
		out.Body, out.GetBody = nil, nil
		return
	}
	// The transport sends a body of known length with the head; GetBody
	// lets it send it again on a connection the engine had closed before
	// reading it, and retarget to the next engine instance.
	w.sent.Reset(body)
	out.Body = &w.sent
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// abort ends a request whose client left (or whose server is shutting
// down) without writing anything: net/http drops the connection.
func (c *call) abort() {
	c.cancelled = true
	panic(http.ErrAbortHandler)
}

// listModels serves GET /v1/models: every model, each followed by its
// aliases when Options.ListAliases is set.
func (c *call) listModels(r *http.Request) {
	if r.Method != http.MethodGet {
		c.fail(http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on /v1/models")
		return
	}
	c.seesArgs = c.isAdmin(r)
	infos := c.g.models.List()
	list := modelList{Object: "list", Data: make([]modelEntry, 0, len(infos))}
	c.listed(infos, func(m ModelInfo, alias string) { list.Data = append(list.Data, c.entry(m, alias)) })
	c.writeValue(http.StatusOK, list)
}

// listed calls add for every entry of a listing the request's key may see:
// each model (by name, alias ""), followed by its aliases when
// Options.ListAliases is set.
func (c *call) listed(infos []ModelInfo, add func(m ModelInfo, alias string)) {
	for _, m := range infos {
		if m.Unlisted || !c.scope.mayList(m) {
			continue
		}
		if !c.g.opts.ListAliases || c.scope.MayUse(m.Name, m.Name) {
			add(m, "")
		}
		if c.g.opts.ListAliases {
			for _, a := range m.Aliases {
				if c.scope.MayUse(a, m.Name) {
					add(m, a)
				}
			}
		}
	}
}

// getModel serves GET /v1/models/<name or alias>: the entry /v1/models
// lists for that name.
func (c *call) getModel(r *http.Request, name string) {
	if r.Method != http.MethodGet {
		c.fail(http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on /v1/models/")
		return
	}
	model, ok := c.resolve(name)
	if !ok {
		return
	}
	alias := ""
	if model != name && c.g.opts.ListAliases {
		alias = name
	}
	c.seesArgs = c.isAdmin(r)
	if m, ok := c.info(model); ok {
		c.writeValue(http.StatusOK, c.entry(m, alias))
		return
	}
	// Removed by a reload between Resolve and List.
	c.fail(http.StatusNotFound, "model_not_found", fmt.Sprintf("model %q does not exist", name))
}

type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

type modelEntry struct {
	ID      string    `json:"id"`
	Object  string    `json:"object"`
	Created int64     `json:"created"`
	OwnedBy string    `json:"owned_by"`
	Napd    modelNapd `json:"napd"`
	// Status is the router API's status object (router.go), for the UIs
	// that read it from /v1/models too.
	Status routerStatus `json:"status"`
}

type modelNapd struct {
	State       string   `json:"state"`
	Reason      string   `json:"reason,omitempty"`
	Aliases     []string `json:"aliases"`
	AliasOf     string   `json:"alias_of,omitempty"`
	RoomWaiting int      `json:"room_waiting,omitempty"`
	WaitingFor  string   `json:"waiting_for,omitempty"`
	// Weights and WeightsResident: only for a model with weight files.
	Weights         int64  `json:"weights_bytes,omitempty"`
	WeightsResident *int64 `json:"weights_resident_bytes,omitempty"`
	// Load is how far the load got while the model wakes, when measured.
	Load *loadprogress.Wire `json:"load,omitempty"`
}

// entry is m's /v1/models entry or, when alias is not "", the entry of
// that alias of m.
func (c *call) entry(m ModelInfo, alias string) modelEntry {
	e := modelEntry{
		ID: m.Name, Object: "model", Created: c.g.created, OwnedBy: "napd",
		Napd:   modelNapd{State: m.State, Reason: m.Reason, Aliases: m.Aliases, RoomWaiting: m.RoomWaiting, WaitingFor: m.WaitingFor},
		Status: c.status(m),
	}
	if m.Weights > 0 {
		e.Napd.Weights, e.Napd.WeightsResident = m.Weights, &m.WeightsResident
	}
	if m.Loading != nil {
		e.Napd.Load = m.Loading.Wire()
	}
	if alias != "" {
		e.ID, e.Napd.AliasOf, e.Napd.Aliases = alias, m.Name, nil
	}
	if e.Napd.Aliases == nil {
		e.Napd.Aliases = []string{}
	}
	return e
}

// errorBody is OpenAI's error shape.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Code    string  `json:"code"`
	Param   *string `json:"param"`
}

// fail writes an OpenAI-shaped error, or Anthropic's shape on its routes.
func (c *call) fail(status int, code, msg string) {
	if c.anthropic {
		c.failAnthropic(status, msg)
		return
	}
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	c.writeValue(status, errorBody{Error: errorDetail{Message: msg, Type: typ, Code: code}})
}

func (c *call) writeValue(status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain structs of strings and numbers reach here.
		panic(fmt.Sprintf("gateway: encode reply: %v", err))
	}
	c.writeJSON(status, b)
}

func (c *call) writeJSON(status int, b []byte) {
	h := c.w.Header()
	c.setModelHeaders(h)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	c.w.WriteHeader(status)
	_, _ = c.w.Write(b)
}

// setModelHeaders adds X-Queue-Depth (unless the engine set it) and
// X-Napd-Wake-Ms to the headers of a reply for a known model.
func (c *call) setModelHeaders(h http.Header) {
	if c.model == "" {
		return
	}
	if headerValue(h, HeaderQueueDepth) == "" {
		h[HeaderQueueDepth] = depthValue(c.g.models.QueueDepth(c.model))
	}
	if c.wake > 0 {
		h.Set(HeaderWakeMs, strconv.FormatInt(c.wake.Milliseconds(), 10))
	}
	if c.class.Set() {
		h.Set(HeaderPriority, c.g.opts.Priorities.Name(c.class))
	}
}

// depthValues are the X-Queue-Depth values of the usual depths, made once:
// h.Set would allocate a slice (and a string) per reply. Header values are
// only read, and an Add to one of these (capacity 1) appends to a copy.
var depthValues = func() [][]string {
	v := make([][]string, 64)
	for n := range v {
		v[n] = []string{strconv.Itoa(n)}
	}
	return v
}()

func depthValue(n int) []string {
	if n >= 0 && n < len(depthValues) {
		return depthValues[n]
	}
	return []string{strconv.Itoa(n)}
}
