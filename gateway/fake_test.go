package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
)

// fakeModels is a Models for tests: two models ("m1" with alias "a1", and
// "m2"), an Admit that can be replaced, and a record of every admission
// and every Done.
type fakeModels struct {
	t         testing.TB
	target    *url.URL
	transport http.RoundTripper

	mu         sync.Mutex
	admissions []lease.Request
	depth      int
	wake       time.Duration
	served     string // the tickets' ServedName
	unlisted   string // a model List marks Unlisted (listed = false)
	// admit, when set, replaces the default (a ticket to target).
	admit func(ctx context.Context, a lease.Request) (*Ticket, error)
	// forget keeps no admissions: a benchmark's would grow without bound.
	forget bool

	done chan Outcome
}

func newFakeModels(t testing.TB, target string) *fakeModels {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	// The transport napd's links use, as the agent makes it.
	return &fakeModels{t: t, target: u, transport: NewTransport(64, nil), done: make(chan Outcome, 100), depth: 3}
}

func (f *fakeModels) Resolve(name string) (string, bool) {
	switch name {
	case "m1", "a1":
		return "m1", true
	case "m2":
		return "m2", true
	}
	return "", false
}

func (f *fakeModels) List() []ModelInfo {
	infos := []ModelInfo{
		{Name: "m1", Aliases: []string{"a1"}, State: "awake", Serving: true, Weights: 8 << 30, WeightsResident: 2 << 30},
		{Name: "m2", State: "failed", Reason: "exit status 1 after 3 attempts"},
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range infos {
		infos[i].Unlisted = infos[i].Name == f.unlisted
	}
	return infos
}

func (f *fakeModels) QueueDepth(string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.depth
}

func (f *fakeModels) Admit(ctx context.Context, a lease.Request) (*Ticket, error) {
	f.mu.Lock()
	if !f.forget {
		f.admissions = append(f.admissions, a)
	}
	admit, wake, served := f.admit, f.wake, f.served
	f.mu.Unlock()
	if admit != nil {
		return admit(ctx, a)
	}
	t := f.ticket(wake)
	t.ServedName = served
	return t, nil
}

// ticket is a ticket to target whose Done fails the test when called twice.
func (f *fakeModels) ticket(wake time.Duration) *Ticket {
	calls := 0
	var mu sync.Mutex
	return &Ticket{
		Target: f.target, Transport: f.transport, WakeWait: wake,
		Done: func(o Outcome) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if n > 1 {
				f.t.Errorf("Done called %d times", n)
				return
			}
			f.done <- o
		},
	}
}

func (f *fakeModels) admitted() []lease.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]lease.Request(nil), f.admissions...)
}

// outcome waits for the next Done.
func (f *fakeModels) outcome() Outcome {
	f.t.Helper()
	select {
	case o := <-f.done:
		return o
	case <-time.After(5 * time.Second):
		f.t.Fatal("Done was not called")
		return Outcome{}
	}
}

// noMoreDone asserts that no further Done arrives.
func (f *fakeModels) noMoreDone() {
	f.t.Helper()
	select {
	case o := <-f.done:
		f.t.Fatalf("unexpected Done(%+v)", o)
	case <-time.After(20 * time.Millisecond):
	}
}

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// observation is the labels of one call of Options.Observe.
type observation struct {
	model  string
	status int
}

// env is an engine, a gateway in front of it, and a client.
type env struct {
	t      *testing.T
	engine *httptest.Server
	models *fakeModels
	gw     *Gateway
	srv    *httptest.Server
	client *http.Client
	logs   *syncBuffer

	obsMu sync.Mutex
	obs   []Observation
	obsCh chan Observation // every observation, in order
}

func newEnv(t *testing.T, engine http.HandlerFunc, opts Options) *env {
	t.Helper()
	e := &env{t: t, logs: &syncBuffer{}, obsCh: make(chan Observation, 100)}
	e.engine = httptest.NewServer(engine)
	t.Cleanup(e.engine.Close)
	e.models = newFakeModels(t, e.engine.URL)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	opts.Observe = func(o Observation) {
		e.obsMu.Lock()
		e.obs = append(e.obs, o)
		e.obsMu.Unlock()
		select {
		case e.obsCh <- o:
		default: // a test that sends many requests reads observed() instead
		}
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = 10 * time.Second
	}
	e.gw = New(opts, e.models)
	e.srv = serveGateway(t, e.gw.Handler(), opts.Logger)
	e.client = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

func (e *env) observations() []observation {
	var out []observation
	for _, o := range e.observed() {
		out = append(out, observation{o.Model, o.Status})
	}
	return out
}

// next waits for the next observation.
func (e *env) next() Observation {
	e.t.Helper()
	select {
	case o := <-e.obsCh:
		return o
	case <-time.After(5 * time.Second):
		e.t.Fatal("no observation within 5s")
		return Observation{}
	}
}

// waitObservations waits until n requests were observed: Observe runs as
// the handler ends, which may be after the client has read the reply.
func (e *env) waitObservations(n int) []observation {
	deadline := time.Now().Add(5 * time.Second)
	for len(e.observed()) < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling the handler's end, which sends nothing
	}
	return e.observations()
}

func (e *env) observed() []Observation {
	e.obsMu.Lock()
	defer e.obsMu.Unlock()
	return append([]Observation(nil), e.obs...)
}

// do sends a request to the gateway and reads the whole reply.
func (e *env) do(method, path, body string, header map[string]string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp, b
}

// wantError asserts an OpenAI-shaped error with status and code.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var shape map[string]map[string]any
	if err := json.Unmarshal(body, &shape); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	e, ok := shape["error"]
	if !ok {
		t.Fatalf("no \"error\" in %s", body)
	}
	if e["code"] != code {
		t.Errorf("code %v, want %q", e["code"], code)
	}
	if m, _ := e["message"].(string); m == "" {
		t.Errorf("empty message in %s", body)
	}
	wantType := "invalid_request_error"
	if status >= 500 {
		wantType = "server_error"
	}
	if e["type"] != wantType {
		t.Errorf("type %v, want %q", e["type"], wantType)
	}
	if p, ok := e["param"]; !ok || p != nil {
		t.Errorf("param %v (present %v), want null", p, ok)
	}
}

// okEngine answers {"ok":true} and records what it saw.
type okEngine struct {
	mu   sync.Mutex
	reqs []seen
}

type seen struct {
	method, path, query string
	header              http.Header
	body                []byte
}

func (o *okEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	o.reqs = append(o.reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), b})
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Engine", "yes")
	_, _ = w.Write([]byte(`{"ok":true}`))
}

func (o *okEngine) seen() []seen {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]seen(nil), o.reqs...)
}

// serveGateway serves h as napd serves its gateway sockets: the server
// NewServer makes (with the default keepalive_timeout), behind a
// ConnLimit of the default max_connections.
func serveGateway(t testing.TB, h http.Handler, log *slog.Logger) *httptest.Server {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := httptest.NewUnstartedServer(h)
	s.Config = NewServer(h, ServerOptions{KeepaliveTimeout: 75 * time.Second, Logger: log})
	s.Listener = NewConnLimit(4096, log).Listener(s.Listener)
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// newServer serves h on loopback for the test and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}
