package supervisor

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/napd/napd/internal/httpfixture"
	"github.com/napd/napd/sleepmode"
)

const recordings = "../testdata/llamacpp/"

// llamaServer plays a llama-server from its recorded answers: /health 503
// "Loading model" for the first loading probes, then 200; /props with
// is_sleeping as it is; /tokenize, a task, wakes it. It records the
// requests as recordingEngine does.
type llamaServer struct {
	t       *testing.T
	mu      sync.Mutex
	reqs    []string
	loading int // health probes still answered 503
	asleep  bool
	props   []byte // the recorded /props body, awake
}

func newLlamaServer(t *testing.T) *llamaServer {
	return &llamaServer{t: t, props: httpfixture.Load(t, recordings+"props.http").Body}
}

func (l *llamaServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	line := requestLine(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, line)
	switch r.URL.Path {
	case "/health":
		if l.loading > 0 {
			l.loading--
			httpfixture.Load(l.t, recordings+"health-loading.http").Serve(w)
			return
		}
		httpfixture.Load(l.t, recordings+"health-ready.http").Serve(w)
	case "/props":
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Write(bytes.Replace(l.props, []byte(`"is_sleeping":false`), []byte(`"is_sleeping":`+strconv.FormatBool(l.asleep)), 1))
	case "/tokenize":
		l.asleep = false
		io.WriteString(w, `{"tokens":[]}`)
	default:
		http.NotFound(w, r)
	}
}

func (l *llamaServer) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reqs
	l.reqs = nil
	return r
}

func (l *llamaServer) spec(t *testing.T) Spec {
	srv := httptest.NewServer(l)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	return Spec{Model: "m", Port: port, Health: "/health", Sleep: sleepmode.LlamaCpp}
}

// An engine asleep by itself is seen through /props (not /slots, which
// would wake it), also with a chat template that makes /props larger than
// other control answers; its wake is an empty tokenize, verified by /props;
// napd's own sleep of it stops it, and is recorded as a stop.
func TestLlamaCpp_AsleepByItselfAndWoken(t *testing.T) {
	eng := newLlamaServer(t)
	eng.props = bytes.Replace(eng.props, []byte(`"chat_template":"`), []byte(`"chat_template":"`+strings.Repeat("x", 200<<10)), 1)
	spec := eng.spec(t)
	b := newFakeBackend(ProcRunning)
	s := newTestSupervisor(t, b)
	ctx := context.Background()

	if asleep, err := s.SleepsByItself(ctx, spec); err != nil || asleep {
		t.Fatalf("awake engine: SleepsByItself = %v, %v", asleep, err)
	}
	eng.asleep = true
	if asleep, err := s.SleepsByItself(ctx, spec); err != nil || !asleep {
		t.Fatalf("engine asleep by itself: SleepsByItself = %v, %v", asleep, err)
	}
	assertRequests(t, "SleepsByItself", eng.take(), []string{"GET /props", "GET /props"})
	if o, err := s.Observe(ctx, spec); err != nil || o.State != Asleep {
		t.Errorf("Observe = %+v, %v; want asleep", o, err)
	}
	eng.take()
	if err := s.Wake(ctx, spec); err != nil {
		t.Fatal(err)
	}
	assertRequests(t, "wake", eng.take(), []string{"GET /health", "GET /props", `POST /tokenize {"content":""}`, "GET /props", "GET /health"})
	if calls := b.recorded(); len(calls) != 0 {
		t.Errorf("backend calls %v: a wake of an engine asleep by itself starts nothing", calls)
	}

	if err := s.Sleep(ctx, spec, sleepmode.LlamaCpp); err != nil {
		t.Fatal(err)
	}
	if calls := b.recorded(); len(calls) != 1 || calls[0] != "stop" {
		t.Errorf("napd's sleep of a llama-server: backend calls %v, want a stop", calls)
	}
	if got := Performed(sleepmode.LlamaCpp); got != sleepmode.Stop {
		t.Errorf("Performed(llamacpp) = %q, want stop", got)
	}
	for _, other := range []string{sleepmode.Stop, sleepmode.VLLML1, sleepmode.SGLang} {
		if got := Performed(other); got != other {
			t.Errorf("Performed(%s) = %q", other, got)
		}
	}
}

// Only a strategy whose engine sleeps by itself is asked: the others'
// engines sleep when napd says so, and nothing is sent to them.
func TestSleepsByItself_OnlyLlamaCpp(t *testing.T) {
	eng := &recordingEngine{sleeping: true}
	spec := engineSpec(t, eng, sleepmode.VLLML1)
	s := newTestSupervisor(t, newFakeBackend(ProcRunning))
	if asleep, err := s.SleepsByItself(context.Background(), spec); err != nil || asleep {
		t.Errorf("vllm-l1: SleepsByItself = %v, %v; want false without asking", asleep, err)
	}
	if reqs := eng.take(); len(reqs) != 0 {
		t.Errorf("asked %v", reqs)
	}
}

// A llama-server answers 503 "Loading model" while it loads (recorded):
// the wake's health poll waits through it.
func TestLlamaCpp_WakeWaitsThroughLoading(t *testing.T) {
	eng := newLlamaServer(t)
	eng.loading = 3
	spec := eng.spec(t)
	b := newFakeBackend(ProcStopped)
	s := newTestSupervisor(t, b)
	if err := s.Wake(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	assertRequests(t, "wake from stopped", eng.take(), []string{"GET /health", "GET /health", "GET /health", "GET /health"})
	if calls := b.recorded(); len(calls) != 1 || calls[0] != "start" {
		t.Errorf("backend calls %v, want a start", calls)
	}
}
