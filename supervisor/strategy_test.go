package supervisor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/sleepmode"
)

// fakeBackend is a Backend whose process state the test sets; it records
// Start and Stop.
type fakeBackend struct {
	mu      sync.Mutex
	state   ProcState
	calls   []string
	events  chan Event
	onStart func() // runs inside Start
	err     error  // returned by Status
}

func newFakeBackend(state ProcState) *fakeBackend {
	return &fakeBackend{state: state, events: make(chan Event, 16)}
}

func (f *fakeBackend) Name() string { return "fake" }
func (f *fakeBackend) Start(ctx context.Context, spec Spec) error {
	f.mu.Lock()
	f.calls = append(f.calls, "start")
	f.state = ProcRunning
	f.mu.Unlock()
	if f.onStart != nil {
		f.onStart()
	}
	return nil
}
func (f *fakeBackend) Stop(ctx context.Context, spec Spec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "stop")
	f.state = ProcStopped
	return nil
}
func (f *fakeBackend) Status(ctx context.Context, spec Spec) (Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Status{State: f.state}, f.err
}
func (f *fakeBackend) Running(ctx context.Context) ([]string, error) { return nil, nil }
func (f *fakeBackend) Events() <-chan Event                          { return f.events }
func (f *fakeBackend) Close() error                                  { close(f.events); return nil }

func (f *fakeBackend) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// recordingEngine is an HTTP engine that records every request as
// "METHOD /path?query body" and plays vLLM's sleep state.
type recordingEngine struct {
	mu          sync.Mutex
	reqs        []string
	sleeping    bool
	ignoreSleep bool // /sleep answers 200 but the engine stays awake
	healthCode  int
}

// requestLine is a request as the fake engines record it: "METHOD
// /path?query body".
func requestLine(r *http.Request) string {
	body, _ := io.ReadAll(r.Body)
	line := r.Method + " " + r.URL.RequestURI()
	if len(body) > 0 {
		line += " " + string(body)
	}
	return line
}

func (e *recordingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	line := requestLine(r)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reqs = append(e.reqs, line)
	switch r.URL.Path {
	case "/health":
		if e.healthCode != 0 {
			w.WriteHeader(e.healthCode)
		}
	case "/is_sleeping":
		io.WriteString(w, `{"is_sleeping": `+strconv.FormatBool(e.sleeping)+`}`)
	case "/sleep":
		e.sleeping = !e.ignoreSleep
	case "/wake_up":
		// vLLM is awake once nothing is left asleep: no tags, or the KV cache last.
		if tags := r.URL.Query()["tags"]; len(tags) == 0 || slices.Contains(tags, "kv_cache") {
			e.sleeping = false
		}
	}
}

func (e *recordingEngine) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.reqs
	e.reqs = nil
	return r
}

// engineSpec serves e and returns a spec pointing at it.
func engineSpec(t *testing.T, e *recordingEngine, sleep string) Spec {
	t.Helper()
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	return Spec{Model: "m", Port: port, Health: "/health", Sleep: sleep}
}

func newTestSupervisor(t *testing.T, b Backend) *Supervisor {
	t.Helper()
	s := New(b, Options{})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func assertRequests(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: engine saw\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestStrategies_ExactRequests(t *testing.T) {
	const level2Wake = `{"method":"reload_weights"}`
	for _, tc := range []struct {
		strategy  string
		sleepReqs []string
		wakeReqs  []string
	}{
		{
			strategy:  sleepmode.VLLML1,
			sleepReqs: []string{"POST /sleep?level=1", "GET /is_sleeping"},
			wakeReqs:  []string{"GET /health", "GET /is_sleeping", "POST /wake_up", "GET /is_sleeping", "GET /health"},
		},
		{
			strategy:  sleepmode.VLLML2,
			sleepReqs: []string{"POST /sleep?level=2", "GET /is_sleeping"},
			wakeReqs: []string{
				"GET /health", "GET /is_sleeping",
				"POST /wake_up?tags=weights",
				"POST /collective_rpc " + level2Wake,
				"POST /wake_up?tags=kv_cache",
				"POST /reset_prefix_cache",
				"GET /is_sleeping", "GET /health",
			},
		},
		{
			strategy:  sleepmode.SGLang,
			sleepReqs: []string{"POST /release_memory_occupation {}"},
			wakeReqs:  []string{"GET /health", "POST /resume_memory_occupation {}", "GET /health"},
		},
	} {
		t.Run(tc.strategy, func(t *testing.T) {
			eng := &recordingEngine{}
			spec := engineSpec(t, eng, tc.strategy)
			b := newFakeBackend(ProcRunning)
			s := newTestSupervisor(t, b)
			ctx := context.Background()

			if err := s.Sleep(ctx, spec, tc.strategy); err != nil {
				t.Fatal(err)
			}
			assertRequests(t, "sleep", eng.take(), tc.sleepReqs)
			if o, err := s.Observe(ctx, spec); err != nil || o.State != Asleep {
				t.Errorf("Observe after sleep = %+v, %v", o, err)
			}
			eng.take()
			if err := s.Wake(ctx, spec); err != nil {
				t.Fatal(err)
			}
			assertRequests(t, "wake", eng.take(), tc.wakeReqs)
			if o, err := s.Observe(ctx, spec); err != nil || o.State != Awake {
				t.Errorf("Observe after wake = %+v, %v", o, err)
			}
			// Waking an awake engine only checks it.
			eng.take()
			if err := s.Wake(ctx, spec); err != nil {
				t.Fatal(err)
			}
			want := []string{"GET /health", "GET /is_sleeping"}
			if tc.strategy == sleepmode.SGLang {
				want = want[:1]
			}
			assertRequests(t, "wake when awake", eng.take(), want)
			if calls := b.recorded(); len(calls) != 0 {
				t.Errorf("backend calls %v, want none", calls)
			}
		})
	}
}

func TestStrategies_Stop(t *testing.T) {
	eng := &recordingEngine{}
	spec := engineSpec(t, eng, sleepmode.VLLML1)
	b := newFakeBackend(ProcRunning)
	s := newTestSupervisor(t, b)
	ctx := context.Background()
	// The planner may stop a vllm-l1 model under host-memory pressure.
	if err := s.Sleep(ctx, spec, sleepmode.Stop); err != nil {
		t.Fatal(err)
	}
	assertRequests(t, "stop", eng.take(), nil)
	if o, _ := s.Observe(ctx, spec); o.State != Stopped {
		t.Errorf("Observe = %+v", o)
	}
	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	assertRequests(t, "wake after stop", eng.take(), []string{"GET /health"})
	if calls := b.recorded(); !slices.Equal(calls, []string{"stop", "start"}) {
		t.Errorf("backend calls %v", calls)
	}
}

func TestStrategies_NoneAndUnknownNeverSleep(t *testing.T) {
	eng := &recordingEngine{}
	spec := engineSpec(t, eng, sleepmode.None)
	b := newFakeBackend(ProcRunning)
	s := newTestSupervisor(t, b)
	for _, name := range []string{sleepmode.None, "vllm-l3", ""} {
		if err := s.Sleep(context.Background(), spec, name); err == nil {
			t.Errorf("Sleep with %q succeeded", name)
		}
	}
	assertRequests(t, "none", eng.take(), nil)
	if calls := b.recorded(); len(calls) != 0 {
		t.Errorf("backend calls %v", calls)
	}
}

func TestStrategies_VLLMStillAwakeAfterSleepFails(t *testing.T) {
	eng := &recordingEngine{ignoreSleep: true}
	spec := engineSpec(t, eng, sleepmode.VLLML1)
	s := newTestSupervisor(t, newFakeBackend(ProcRunning))
	err := s.Sleep(context.Background(), spec, sleepmode.VLLML1)
	if err == nil || !strings.Contains(err.Error(), "is_sleeping=false") {
		t.Fatalf("Sleep = %v, want is_sleeping=false error", err)
	}
	// Not recorded as asleep: Observe asks the engine.
	if o, _ := s.Observe(context.Background(), spec); o.State != Awake {
		t.Errorf("Observe = %+v", o)
	}
}

func TestStrategies_ControlErrorNamesTheCall(t *testing.T) {
	eng := &recordingEngine{}
	spec := engineSpec(t, eng, sleepmode.SGLang)
	spec.Port = closedPort(t)
	s := newTestSupervisor(t, newFakeBackend(ProcRunning))
	err := s.Sleep(context.Background(), spec, sleepmode.SGLang)
	if err == nil || !strings.Contains(err.Error(), "POST /release_memory_occupation") {
		t.Errorf("Sleep = %v", err)
	}
}

func TestStrategyTable_CoversConfig(t *testing.T) {
	for _, name := range []string{sleepmode.Stop, sleepmode.VLLML1, sleepmode.VLLML2, sleepmode.SGLang, sleepmode.LlamaCpp, sleepmode.None} {
		if _, err := lookupStrategy(name); err != nil {
			t.Error(err)
		}
	}
	if len(strategies) != 6 {
		t.Errorf("%d strategies, config names 6", len(strategies))
	}
}

func TestObserve(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		state  ProcState
		err    error
		engine *recordingEngine // nil: nothing listens
		want   Observed
	}{
		{"stopped", ProcStopped, nil, nil, Stopped},
		{"failed", ProcFailed, nil, nil, Stopped},
		{"unknown", ProcUnknown, nil, nil, Unverified},
		{"backend error", ProcUnknown, errors.New("no bus"), nil, Unverified},
		{"no answer", ProcRunning, nil, nil, Unverified},
		{"unhealthy", ProcRunning, nil, &recordingEngine{healthCode: 503}, Unverified},
		{"asleep", ProcRunning, nil, &recordingEngine{sleeping: true}, Asleep},
		{"awake", ProcRunning, nil, &recordingEngine{}, Awake},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := Spec{Model: "m", Port: closedPort(t), Sleep: sleepmode.VLLML2}
			if tc.engine != nil {
				spec = engineSpec(t, tc.engine, sleepmode.VLLML2)
			}
			b := newFakeBackend(tc.state)
			b.err = tc.err
			s := newTestSupervisor(t, b)
			o, err := s.Observe(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			if o.State != tc.want || o.Reason == "" {
				t.Errorf("Observe = %v (%s), want %v", o.State, o.Reason, tc.want)
			}
		})
	}
	s := newTestSupervisor(t, newFakeBackend(ProcRunning))
	if _, err := s.Observe(ctx, Spec{Model: "m", Sleep: "bogus"}); err == nil {
		t.Error("Observe with unknown strategy succeeded")
	}
}

func TestWake_ExitDuringWakeFailsAtOnce(t *testing.T) {
	eng := &recordingEngine{healthCode: 503}
	spec := engineSpec(t, eng, sleepmode.Stop)
	b := newFakeBackend(ProcStopped)
	b.onStart = func() {
		// An exit from before this attempt (a preceding stop) is not its.
		b.events <- Event{Model: "m", State: ProcStopped, Reason: "old", Time: time.Now().Add(-time.Minute)}
		b.events <- Event{Model: "other", State: ProcFailed, Reason: "other model", Time: time.Now()}
		b.events <- Event{Model: "m", State: ProcFailed, Reason: "exit status 1", Time: time.Now()}
	}
	s := newTestSupervisor(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := s.Wake(ctx, spec)
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Reason != "exit status 1" {
		t.Fatalf("Wake = %v, want ExitError exit status 1", err)
	}
	if want := "wake m: engine failed during wake: exit status 1"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	// Every event still reaches Events, in order.
	var reasons []string
	for range 3 {
		reasons = append(reasons, (<-s.Events()).Reason)
	}
	if !slices.Equal(reasons, []string{"old", "other model", "exit status 1"}) {
		t.Errorf("events %v", reasons)
	}
}

func TestWake_OldExitDoesNotFailWake(t *testing.T) {
	eng := &recordingEngine{}
	spec := engineSpec(t, eng, sleepmode.Stop)
	b := newFakeBackend(ProcStopped)
	b.onStart = func() {
		b.events <- Event{Model: "m", State: ProcStopped, Reason: "old", Time: time.Now().Add(-time.Minute)}
	}
	s := newTestSupervisor(t, b)
	if err := s.Wake(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	u, _ := url.Parse(srv.URL)
	srv.Close()
	port, _ := strconv.Atoi(u.Port())
	return port
}

func FuzzParseIsSleeping(f *testing.F) {
	f.Add([]byte(`{"is_sleeping": true}`))
	f.Add([]byte(`{"is_sleeping": false, "x": 1}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseIsSleeping(b)
		if err != nil && v {
			t.Error("error with sleeping=true")
		}
	})
}

func TestParseIsSleeping(t *testing.T) {
	for in, want := range map[string]bool{`{"is_sleeping": true}`: true, `{"is_sleeping":false}`: false} {
		if got, err := parseIsSleeping([]byte(in)); err != nil || got != want {
			t.Errorf("parseIsSleeping(%s) = %t, %v", in, got, err)
		}
	}
	for _, in := range []string{`{}`, `{"is_sleeping": "yes"}`, `[]`, ``} {
		if _, err := parseIsSleeping([]byte(in)); err == nil {
			t.Errorf("parseIsSleeping(%s) succeeded", in)
		}
	}
}
