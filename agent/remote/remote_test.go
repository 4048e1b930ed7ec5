package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/internal/fakeclock"
)

var t0 = time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)

// rig is a remote model on a hand clock, with the tracker and the events
// it gets.
type rig struct {
	t       *testing.T
	clock   *fakeclock.Clock
	tracker *lease.Tracker
	m       *Model
	mu      sync.Mutex
	events  []control.Event
}

// remoteCfg is a remote model's config, as config.Parse makes it, at url.
func remoteCfg(url string, with func(*config.Model)) *config.Model {
	cfg := &config.Model{Name: "cloud", URL: url, Health: config.DefaultRemoteHealth, APIKeyHeader: config.DefaultAPIKeyHeader,
		MaxConcurrency: 1, Queue: 1, HealthInterval: 10 * time.Second, HealthFailures: 2}
	if with != nil {
		with(cfg)
	}
	return cfg
}

func newRig(t *testing.T, cfg *config.Model) *rig {
	t.Helper()
	r := &rig{t: t, clock: fakeclock.New(t0), tracker: lease.NewTracker(lease.Options{})}
	r.tracker.Register("b", t0)
	l, err := NewLink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	r.m = New(Deps{Tracker: r.tracker, Clock: r.clock.Now, Log: slog.New(slog.DiscardHandler), Ctx: context.Background(),
		Emit: func(e control.Event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }}, l)
	return r
}

func (r *rig) active(model string) int {
	ev, _ := r.tracker.Evidence(model)
	return ev.Active
}

// admit asks for a slot on its own goroutine; the answer comes on the
// channel.
type answer struct {
	t   *gateway.Ticket
	err error
}

func (r *rig) admit(ctx context.Context) chan answer {
	ch := make(chan answer, 1)
	go func() {
		t, err := r.m.Admit(ctx, lease.Request{Client: "alice"})
		ch <- answer{t, err}
	}()
	return ch
}

func (r *rig) waitLine(n int) {
	r.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); r.m.QueueDepth() != n; {
		if time.Now().After(deadline) {
			r.t.Fatalf("queue depth %d, want %d", r.m.QueueDepth(), n)
		}
		time.Sleep(time.Millisecond) // a goroutine taking its place in line; nothing to be told of
	}
}

// max_concurrency slots, then a line of queue requests, then 503s; a
// request that leaves the line gives up its place, and a slot freed goes
// to the next in line.
func TestModel_AdmissionSlotsAndLine(t *testing.T) {
	r := newRig(t, remoteCfg("http://127.0.0.1:1/v1", nil))
	first := <-r.admit(context.Background())
	if first.err != nil || first.t.Target.String() != "http://127.0.0.1:1" || first.t.Remote.Name != "cloud" || first.t.ServedBy != "" {
		t.Fatalf("first: %+v %v", first.t, first.err)
	}
	second := r.admit(context.Background())
	r.waitLine(1)
	third := <-r.admit(context.Background())
	var ref *gateway.Refusal
	if !errors.As(third.err, &ref) || ref.Status != http.StatusServiceUnavailable || ref.Code != "queue_full" || ref.RetryAfter <= 0 {
		t.Fatalf("third: %v, want a 503 queue_full with Retry-After", third.err)
	}
	if n := r.active("cloud"); n != 2 {
		t.Errorf("leases: %d, want the granted one and the one in line", n)
	}
	first.t.Done(gateway.Outcome{})
	got := <-second
	if got.err != nil {
		t.Fatalf("second: %v", got.err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	leaving := r.admit(ctx)
	r.waitLine(1)
	cancel()
	if a := <-leaving; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("a request that left: %v", a.err)
	}
	if r.m.QueueDepth() != 0 || r.active("cloud") != 1 {
		t.Errorf("after it left: depth %d, leases %d", r.m.QueueDepth(), r.active("cloud"))
	}
	got.t.Done(gateway.Outcome{})
	got.t.Done(gateway.Outcome{}) // twice: the second changes nothing
	if s := r.m.Snapshot(); s.Active != 0 || r.active("cloud") != 0 {
		t.Errorf("after the last Done: %+v, leases %d", s, r.active("cloud"))
	}
}

// An overflowed request's lease moves here and it is served by a ticket
// that says so; a remote that does not answer, or whose line is full,
// refuses it without moving anything.
func TestModel_AdoptMovesTheLease(t *testing.T) {
	r := newRig(t, remoteCfg("http://127.0.0.1:1/v1", func(c *config.Model) { c.Queue = 0 }))
	id := func() lease.ID {
		a, err := r.tracker.Begin(r.clock.Now(), lease.Request{Model: "b"})
		if err != nil {
			t.Fatal(err)
		}
		return a.ID
	}
	if _, _, err := r.m.Adopt(context.Background(), id()); !errors.Is(err, ErrUnavailable) || r.active("b") != 1 {
		t.Fatalf("not checked yet: %v (b's leases %d), want ErrUnavailable and nothing moved", err, r.active("b"))
	}
	r.m.mu.Lock()
	r.m.answered("")
	r.m.mu.Unlock()
	tk, moved, err := r.m.Adopt(context.Background(), id())
	if err != nil || tk.ServedBy != "cloud" || moved.From != "b" || moved.Idle || r.active("cloud") != 1 {
		t.Fatalf("Adopt: %+v %+v %v (cloud's leases %d)", tk, moved, err, r.active("cloud"))
	}
	if _, _, err := r.m.Adopt(context.Background(), id()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("its one slot taken, no line: %v, want ErrUnavailable", err)
	}
	tk.Done(gateway.Outcome{})
	if r.active("cloud") != 0 || r.active("b") != 2 {
		t.Errorf("after Done: cloud %d, b %d leases", r.active("cloud"), r.active("b"))
	}
}

// napdServer answers GET /v1/models as another napd would, with status
// and the model's state set by the test, and records what it was sent.
type napdServer struct {
	*httptest.Server
	status atomic.Int32
	state  atomic.Value
	auth   atomic.Value
}

func newNapdServer(t *testing.T) *napdServer {
	s := &napdServer{}
	s.status.Store(http.StatusOK)
	s.state.Store("sleeping")
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.auth.Store(r.Header.Get("Authorization"))
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(s.status.Load()))
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"other","napd":{"state":"awake"}},{"id":"qwen","napd":{"state":%q}}]}`, s.state.Load())
	}))
	t.Cleanup(s.Close)
	return s
}

// The health checks: awake on an answer (with what a remote napd says of
// the model), unverified after health_failures failures in a row (the
// reason says what failed), awake again on the next answer; each change
// of state is an event. A failed request counts as a failure too.
func TestModel_Health(t *testing.T) {
	srv := newNapdServer(t)
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("sk-remote\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, remoteCfg(srv.URL+"/v1", func(c *config.Model) { c.ServedName, c.APIKeyFile = "qwen", key }))
	want := func(state lifecycle.State, remote, reason string) {
		t.Helper()
		s := r.m.Snapshot()
		if s.State != state || s.RemoteState != remote || !strings.Contains(s.Reason, reason) {
			t.Fatalf("snapshot %+v, want %s, remote_state %q, reason %q", s, state, remote, reason)
		}
	}
	want(lifecycle.Unverified, "", "not checked yet")
	check := func() { r.m.check(context.Background(), r.m.link) }
	check()
	want(lifecycle.Awake, "sleeping", "")
	if got := srv.auth.Load(); got != "Bearer sk-remote" {
		t.Errorf("the health check sent Authorization %q", got)
	}
	srv.status.Store(http.StatusServiceUnavailable)
	check()
	want(lifecycle.Awake, "sleeping", "") // one failure of two
	check()
	want(lifecycle.Unverified, "", "health check GET /v1/models: answered 503 (2 in a row)")
	srv.status.Store(http.StatusOK)
	srv.state.Store("awake")
	check()
	want(lifecycle.Awake, "awake", "")

	tk := <-r.admit(context.Background())
	tk.t.Done(gateway.Outcome{Outcome: lease.Outcome{Cancelled: true}, Fault: gateway.FaultRefused})
	want(lifecycle.Awake, "awake", "")
	tk = <-r.admit(context.Background())
	tk.t.Done(gateway.Outcome{Outcome: lease.Outcome{Cancelled: true}, Fault: gateway.FaultFailed})
	want(lifecycle.Unverified, "", "a request failed: failed (2 in a row)")
	tk = <-r.admit(context.Background())
	tk.t.Done(gateway.Outcome{})
	want(lifecycle.Awake, "", "")

	r.mu.Lock()
	defer r.mu.Unlock()
	var changes []string
	for _, e := range r.events {
		changes = append(changes, e.From+">"+e.To)
	}
	if got := strings.Join(changes, " "); got != "unverified>awake awake>unverified unverified>awake awake>unverified unverified>awake" {
		t.Errorf("events %s", got)
	}
}

// A check is due every health_interval from the last one's end, one at a
// time; health_interval = 0 checks never, and the model is awake until
// its requests say otherwise.
func TestModel_ChecksWhenDue(t *testing.T) {
	srv := newNapdServer(t)
	r := newRig(t, remoteCfg(srv.URL, nil))
	r.m.Tick() // due at once: the first check
	waitState(t, r.m, lifecycle.Awake)
	r.m.mu.Lock()
	next, probing := r.m.next, r.m.probing
	r.m.mu.Unlock()
	if probing || !next.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("after the first check: next %s, probing %v", next, probing)
	}
	srv.status.Store(http.StatusInternalServerError)
	r.clock.Advance(9 * time.Second)
	r.m.Tick() // not due
	r.clock.Advance(time.Second)
	r.m.mu.Lock()
	if r.m.probing {
		t.Error("a check started before it was due")
	}
	r.m.mu.Unlock()

	never := newRig(t, remoteCfg(srv.URL, func(c *config.Model) { c.HealthInterval = 0 }))
	never.m.Tick()
	if s := never.m.Snapshot(); s.State != lifecycle.Awake || never.m.probing {
		t.Errorf("health_interval 0: %+v, probing %v", s, never.m.probing)
	}
}

func waitState(t *testing.T, m *Model, want lifecycle.State) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		m.mu.Lock()
		s, probing := m.h.state, m.probing
		m.mu.Unlock()
		if s == want && !probing {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("state %s (probing %v), want %s", s, probing, want)
		}
		time.Sleep(time.Millisecond) // the check's goroutine, on a real socket
	}
}

// A reload that reaches the remote elsewhere checks it afresh; one that
// changes only limits keeps what napd knows, and its new slots serve the
// line at once.
func TestModel_Reconfigure(t *testing.T) {
	srv := newNapdServer(t)
	r := newRig(t, remoteCfg(srv.URL, nil))
	r.m.check(context.Background(), r.m.link)
	first := <-r.admit(context.Background())
	second := r.admit(context.Background())
	r.waitLine(1)
	more, err := NewLink(remoteCfg(srv.URL, func(c *config.Model) { c.MaxConcurrency = 2 }))
	if err != nil {
		t.Fatal(err)
	}
	r.m.Reconfigure(more)
	if a := <-second; a.err != nil || a.t.Transport != more.tr {
		t.Fatalf("the request in line after max_concurrency grew: %v", a.err)
	}
	if s := r.m.Snapshot(); s.State != lifecycle.Awake {
		t.Errorf("limits changed: %+v, want still awake", s)
	}
	first.t.Done(gateway.Outcome{Fault: gateway.FaultFailed}) // of the old link: not held against the new
	if s := r.m.Snapshot(); s.Reason != "" {
		t.Errorf("an old link's failure counted: %+v", s)
	}
	elsewhere, err := NewLink(remoteCfg("http://127.0.0.1:1", nil))
	if err != nil {
		t.Fatal(err)
	}
	r.m.Reconfigure(elsewhere)
	if s := r.m.Snapshot(); s.State != lifecycle.Unverified || s.Reason != "not checked yet" {
		t.Errorf("another url: %+v, want unverified until checked", s)
	}
}

func TestLink(t *testing.T) {
	for in, want := range map[string]string{
		"https://api.example.com/v1":   "https://api.example.com",
		"https://api.example.com/v1/":  "https://api.example.com",
		"https://openrouter.ai/api/v1": "https://openrouter.ai/api",
		"http://10.0.0.2:8080":         "http://10.0.0.2:8080",
		"http://10.0.0.2:8080/napd":    "http://10.0.0.2:8080/napd",
	} {
		u, _ := url.Parse(in)
		if got := Root(u).String(); got != want {
			t.Errorf("Root(%s) = %s, want %s", in, got, want)
		}
	}
	if h := Credential("x-api-key", "k"); h.Get("X-Api-Key") != "k" || len(h) != 1 {
		t.Errorf("x-api-key credential: %v", h)
	}
	if h := Credential("authorization", "k"); h.Get("Authorization") != "Bearer k" {
		t.Errorf("bearer credential: %v", h)
	}

	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for name, c := range map[string]struct {
		cfg  func(*config.Model)
		want string
	}{
		"missing key file": {func(c *config.Model) { c.APIKeyFile = filepath.Join(dir, "none") }, "model cloud: api_key_file: open"},
		"key file everyone reads": {func(c *config.Model) { c.APIKeyFile = write("open", "sk-secret", 0o644) },
			"lets every user read it"},
		"two keys":  {func(c *config.Model) { c.APIKeyFile = write("two", "sk-secret\nsk-other\n", 0o600) }, "more than one key"},
		"empty key": {func(c *config.Model) { c.APIKeyFile = write("empty", "\n", 0o600) }, "is empty"},
		"not a CA":  {func(c *config.Model) { c.TLSCAFile = write("ca.pem", "sk-secret", 0o644) }, "model cloud: tls_ca_file: " + dir + "/ca.pem holds no PEM certificate"},
	} {
		_, err := NewLink(remoteCfg("https://h/v1", c.cfg))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "sk-secret") {
			t.Errorf("%s: %v, want %q and no key", name, err, c.want)
		}
	}
}

func TestNapdState(t *testing.T) {
	list := `{"data":[{"id":"a","napd":{"state":"awake"}},{"id":"b","napd":{"state":"sleeping"}},{"id":"c"}]}`
	for id, want := range map[string]string{"a": "awake", "b": "sleeping", "c": "", "d": ""} {
		if got := napdState([]byte(list), id); got != want {
			t.Errorf("%s: %q, want %q", id, got, want)
		}
	}
	for _, body := range []string{`not json`, `{"data":[{"id":"a","napd":{"state":"\u001b[31mred"}}]}`, `{"data":{}}`} {
		if got := napdState([]byte(body), "a"); got != "" {
			t.Errorf("%s: %q", body, got)
		}
	}
}

// FuzzNapdState: whatever a remote answers, what status shows of it is a
// short word or nothing.
func FuzzNapdState(f *testing.F) {
	f.Add([]byte(`{"data":[{"id":"a","napd":{"state":"awake"}}]}`), "a")
	f.Add([]byte(`{"data":[{"id":"a","napd":{"state":"`+strings.Repeat("x", 40)+`"}}]}`), "a")
	f.Fuzz(func(t *testing.T, body []byte, id string) {
		if s := napdState(body, id); s != "" && !stateWord.MatchString(s) {
			t.Fatalf("state %q", s)
		}
	})
}

// The bounds of a health check: its answer is read up to maxHealthBody
// (a longer one is still an answer), and it waits at most
// health_interval (CheckTimeout at most) for a remote that hangs. A
// credential file is at most maxCredential bytes.
func TestModel_CheckBounds(t *testing.T) {
	var served atomic.Int64
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("x", 64<<10))
		for range 2 * maxHealthBody / len(chunk) {
			n, err := w.Write(chunk)
			served.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(huge.Close)
	r := newRig(t, remoteCfg(huge.URL, nil))
	r.m.check(context.Background(), r.m.link)
	if s := r.m.Snapshot(); s.State != lifecycle.Awake || s.RemoteState != "" {
		t.Errorf("an answer of %d bytes: %+v, want awake", served.Load(), s)
	}

	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); hung.Close() })
	r = newRig(t, remoteCfg(hung.URL, func(c *config.Model) { c.HealthInterval, c.HealthFailures = 50*time.Millisecond, 1 }))
	r.m.check(context.Background(), r.m.link)
	if s := r.m.Snapshot(); s.State != lifecycle.Unverified || !strings.Contains(s.Reason, "deadline exceeded") {
		t.Errorf("a remote that hangs: %+v, want unverified by the check's deadline", s)
	}

	big := filepath.Join(t.TempDir(), "big.key")
	if err := os.WriteFile(big, []byte(strings.Repeat("k", maxCredential+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCredential(big); err == nil || strings.Contains(err.Error(), "kkkk") {
		t.Errorf("a credential file over %d bytes: %v", maxCredential, err)
	}
}
