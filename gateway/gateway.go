// Package gateway is napd's OpenAI-compatible HTTP front door. It routes each
// request to a model by the JSON `model` field (or by path, or by a model's
// dedicated socket), asks the model layer (Models) for a slot, which may wake
// the model, and proxies the request to the engine within one deadline.
//
// The gateway decides nothing about sleep or wake: it reads the request,
// applies the deadline and the body limit, and maps what Models and the
// engine answer onto HTTP status codes (see docs/gateway.md).
package gateway

import (
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/gateway/pathrule"
	"github.com/napd/napd/request"
)

// Options configure a Gateway. The zero value of each field is usable.
type Options struct {
	// MaxBody is the largest request body accepted (bytes); larger bodies
	// get 413 before any engine sees them. 0 means no limit.
	MaxBody int64
	// RequestTimeout is the whole budget of one request: upload, queue,
	// wake and inference. X-Request-Timeout may shorten it. 0 means none.
	RequestTimeout time.Duration
	// APIKeys, when non-nil, makes a key (`Authorization: Bearer <key>` or
	// `x-api-key: <key>`) required on everything but /health; both headers
	// are then napd's and never reach an engine.
	APIKeys *APIKeys
	// Admin, when non-nil, serves /napd/… on the shared socket (the admin
	// API and the status page), to admin keys only or, without APIKeys, to
	// loopback clients only.
	Admin http.Handler
	// UpstreamDeny adds entries to pathrule.DefaultDeny and UpstreamAllow
	// exempts entries from it (see docs/security.md): an engine path both
	// lists refuse gets 403 on every route that forwards to an engine.
	UpstreamDeny, UpstreamAllow []string
	// WriteTimeout cuts a client that takes longer than this to accept one
	// write (a stalled stream reader); its lease and slot are released.
	// 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// BodyTimeout bounds the wait for each read of a request body, also
	// when the request has no deadline; 0 means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// Logger receives one line per request; nil means slog.Default().
	Logger *slog.Logger
	// Observe, when non-nil, is called once per request after its last byte
	// with what metrics record of it. It must not block.
	Observe func(Observation)
	// Now reads the clock for durations; nil means time.Now.
	Now func() time.Time
	// Routes are paths outside /v1 routed to a model: POST by the JSON
	// body's `model`, GET by the `model` query parameter.
	Routes []Route
	// ListAliases makes /v1/models list each alias as an entry of its own.
	ListAliases bool
	// CORSOrigins are the browser origins allowed ("*" is any); none means
	// no CORS headers and no preflights answered.
	CORSOrigins []string
	// ProgressAfter and ProgressEvery time the wake progress of models
	// that offer it (see Progress); 0 means the defaults.
	ProgressAfter, ProgressEvery time.Duration
	// Priorities are [policy] priorities: the classes X-Napd-Priority may
	// name; nil means priority.DefaultClasses.
	Priorities priority.Classes
	// Quotas, when set, is asked for the day's use of a key with a quota
	// (gpu_hours_per_day=, tokens_per_day=) before each of its requests.
	Quotas Quotas
	// Streams bounds the event streams of GET /models/sse (nil: a limit
	// of this gateway's own, with the defaults); napd hands every
	// gateway the same one, so a reload frees no room.
	Streams *StreamLimit
	// StreamKeepAlive is how often an idle event stream gets a comment; 0
	// means DefaultStreamKeepAlive.
	StreamKeepAlive time.Duration
	// Stopping, closed when napd starts stopping, ends the event streams
	// cleanly (nil: never).
	Stopping <-chan struct{}
	// SpoolDir holds the part of a multipart upload read before its model
	// field, beyond what is kept in memory, in unnamed files; "" means
	// os.TempDir() (private to napd under its unit's PrivateTmp=).
	SpoolDir string
}

// Route is a path outside /v1 the gateway routes to a model.
type Route struct {
	Method string // "POST": by the body's model; "GET": by ?model=
	Path   string
}

// Defaults of the per-phase timeouts, nginx's: send_timeout and
// client_body_timeout.
const (
	DefaultWriteTimeout = 60 * time.Second
	DefaultBodyTimeout  = 60 * time.Second
)

// MaxHeaderBytes bounds a request's head (request line and header
// fields) on the gateway's sockets: a larger one gets 431. OpenAI clients
// send well under 4 KiB; net/http's default of 1 MiB would let
// max_connections clients hold 4 GiB with heads alone (nginx holds 32 KiB).
const MaxHeaderBytes = 64 << 10

// Observation is one finished request as metrics see it: labels, status
// and timings, never a body or a credential.
type Observation struct {
	Model  string // "" when no model was resolved
	Client string // the API key's name, "" when keys are off
	Kind   request.Kind
	Stream bool
	// Status is the status sent; StatusClientClosed when the client left
	// (or the request was aborted) before any status.
	Status   int
	Duration time.Duration
	// Admitted: the request got a slot and went to its engine (or was
	// replayed). The timings below are set only for admitted requests.
	Admitted bool
	// FirstByte is the time to the first byte of the answer's body.
	FirstByte time.Duration
	// QueueWait is the time spent waiting for a concurrency slot, WakeWait
	// the time spent waiting for a wake (and the room it needed).
	QueueWait, WakeWait time.Duration
	// Usage is the engine's token count, when HasUsage.
	Usage    Usage
	HasUsage bool
	// ServedBy is the remote model an overflowed request went to, "" when
	// it was served by the model it asked for.
	ServedBy string
}

// StatusClientClosed is the status reported to the log and to
// Options.Observe for a request whose client left (or that was aborted)
// before any status was sent. It is never written to a client.
const StatusClientClosed = 499

// Gateway serves the OpenAI-compatible API on top of a Models.
type Gateway struct {
	opts    Options
	models  Models
	log     *slog.Logger
	now     func() time.Time
	created int64 // unix seconds, the "created" of every /v1/models entry
	// proxy forwards every admitted request to its engine.
	proxy   *httputil.ReverseProxy
	routes  map[string]Route // by path
	origins map[string]bool  // CORSOrigins
	rules   pathrule.Rules
	streams *StreamLimit
	// spooled, when set (by tests), learns how much of each form's head
	// was held in memory and on disk.
	spooled func(inMemory int, onDisk int64)
}

// New builds a Gateway that asks models for every admission.
func New(opts Options, models Models) *Gateway {
	g := &Gateway{opts: opts, models: models, log: opts.Logger, now: opts.Now}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.opts.WriteTimeout <= 0 {
		g.opts.WriteTimeout = DefaultWriteTimeout
	}
	if g.opts.BodyTimeout <= 0 {
		g.opts.BodyTimeout = DefaultBodyTimeout
	}
	if g.opts.Priorities == nil {
		g.opts.Priorities = priority.DefaultClasses
	}
	g.rules = pathrule.New(opts.UpstreamDeny, opts.UpstreamAllow)
	if g.streams = opts.Streams; g.streams == nil {
		g.streams = NewStreamLimit(0, 0)
	}
	g.created = g.now().Unix()
	g.proxy = g.newProxy()
	g.routes = make(map[string]Route, len(opts.Routes))
	for _, rt := range opts.Routes {
		g.routes[rt.Path] = rt
	}
	g.origins = make(map[string]bool, len(opts.CORSOrigins))
	for _, o := range opts.CORSOrigins {
		g.origins[o] = true
	}
	return g
}

// APIKeys is the keys the gateway checks (nil when keys are off).
func (g *Gateway) APIKeys() *APIKeys { return g.opts.APIKeys }

// Handler serves the shared gateway socket: /health, /health/models/NAME,
// /v1/models, the OpenAI and Anthropic POST routes (by the body's model),
// llama.cpp's router API (/models…), the configured Routes and
// /upstream/<model>/<path>.
func (g *Gateway) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.serve(w, r, "")
	})
}

// ModelHandler serves a model's dedicated socket: every request except
// GET /health (napd's own) goes to model, whatever its path or body says.
func (g *Gateway) ModelHandler(model string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.serve(w, r, model)
	})
}

// serve runs one request: authentication, routing, and the single log line.
// dedicated is the model of a dedicated socket, "" on the shared one.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, dedicated string) {
	c := &call{g: g, start: g.now(), model: dedicated, anthropic: isAnthropicPath(r.URL.Path)}
	c.w.init(w, g.opts.WriteTimeout)
	// Deferred without recover: an http.ErrAbortHandler panic (a cut
	// stream, a client gone) must reach net/http, and still be logged.
	defer c.finish(r)

	if len(r.TransferEncoding) > 0 {
		// A chunked request's connection ends with its answer. RFC 9112
		// requires it of a request that also had a Content-Length (a
		// smuggling attempt: two readers of it may not agree on its
		// end), and net/http removes that header before napd can see
		// it; a chunked upload is rare enough that one connection each
		// costs nothing.
		w.Header().Set("Connection", "close")
	}
	// Before the key check: browsers send preflights without credentials.
	if c.cors(r) {
		return
	}
	if r.URL.Path == "/health" && r.Method == http.MethodGet {
		c.writeJSON(http.StatusOK, healthBody)
		return
	}
	admin := dedicated == "" && isAdminPath(r.URL.Path)
	if g.opts.APIKeys != nil {
		cred := r.Header
		if admin {
			cred = adminCredential(r)
		}
		name, ok := g.opts.APIKeys.check(cred)
		if !ok {
			c.w.Header().Set("WWW-Authenticate", `Bearer realm="napd"`)
			if admin {
				// Lets a browser ask for the key to show the status page.
				c.w.Header().Add("WWW-Authenticate", `Basic realm="napd admin", charset="UTF-8"`)
			}
			c.fail(http.StatusUnauthorized, "invalid_api_key", "missing or invalid API key")
			return
		}
		c.client, c.scope = name, g.opts.APIKeys.scope(name)
	}
	if dedicated != "" {
		if c.mayUse(dedicated, dedicated) {
			c.forward(r, r.URL.Path, r.URL.RawPath, false)
		}
		return
	}
	path := r.URL.Path
	switch {
	case admin:
		c.admin(r)
	case path == "/v1/models":
		c.listModels(r)
	case strings.HasPrefix(path, "/v1/models/"):
		c.getModel(r, strings.TrimPrefix(path, "/v1/models/"))
	case strings.HasPrefix(path, "/upstream/"):
		c.upstream(r)
	case strings.HasPrefix(path, modelHealthPrefix):
		c.modelHealth(r, strings.TrimPrefix(path, modelHealthPrefix))
	case isRouterPath(path):
		c.router(r)
	case strings.HasPrefix(path, "/v1/"):
		if r.Method != http.MethodPost {
			c.fail(http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+path)
			return
		}
		c.forward(r, r.URL.Path, r.URL.RawPath, true)
	default:
		if rt, ok := g.routes[path]; ok {
			c.route(r, rt)
			return
		}
		c.fail(http.StatusNotFound, "not_found", "no route for "+path)
	}
}

var healthBody = []byte(`{"status":"ok"}`)

func (c *call) observation(status int, d time.Duration) Observation {
	o := Observation{Model: c.model, Client: c.client, Kind: c.kind, Stream: c.stream,
		Status: status, Duration: d, Admitted: c.admitted}
	if c.admitted {
		o.QueueWait, o.WakeWait = c.queueWait, c.wake
		if !c.w.firstByte.IsZero() {
			o.FirstByte = c.w.firstByte.Sub(c.start)
		}
		o.Usage, o.HasUsage = c.usage.Usage()
		if c.ticket != nil {
			o.ServedBy = c.ticket.ServedBy
		}
	}
	return o
}

// finish logs the request and reports it to Observe, once, whether the
// handler returned or is unwinding from an abort.
func (c *call) finish(r *http.Request) {
	status := c.w.status
	if status == 0 {
		status = StatusClientClosed
	}
	d := c.g.now().Sub(c.start)
	if c.g.opts.Observe != nil {
		c.g.opts.Observe(c.observation(status, d))
	}
	level := slog.LevelDebug
	if (status >= 400 || c.cancelled) && !c.probe {
		level = slog.LevelInfo
	}
	ctx := r.Context()
	if !c.g.log.Enabled(ctx, level) {
		// Most requests' line is at debug: not built at all when off.
		return
	}
	attrs := []slog.Attr{
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.String("model", c.model),
		slog.Int("status", status),
		slog.Duration("duration", d),
		slog.Int64("wake_ms", c.wake.Milliseconds()),
		slog.String("client", c.client),
		slog.Bool("stream", c.stream),
		slog.Bool("cancelled", c.cancelled),
		slog.Bool("replayed", c.replayed),
	}
	if c.ticket != nil && c.ticket.ServedBy != "" {
		attrs = append(attrs, slog.String("served_by", c.ticket.ServedBy))
	}
	if c.fault != FaultNone {
		// "cut": the engine's answer ended before it was complete.
		attrs = append(attrs, slog.String("engine_fault", c.fault.String()))
	}
	// Never the body, the query string or a credential: path and labels only.
	c.g.log.LogAttrs(ctx, level, "request", attrs...)
}
