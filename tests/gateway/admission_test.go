package gateway_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// result is one concurrent request's reply.
type result struct {
	resp *http.Response
	body []byte
	err  error
}

// fire sends body to the gateway in the background.
func fire(n *harness.Napd, t *testing.T, body string, header ...string) <-chan result {
	ch := make(chan result, 1)
	ctx := ctxFor(t, 60*time.Second)
	go func() {
		resp, b, err := n.Post(ctx, "/v1/chat/completions", body, header...)
		ch <- result{resp, b, err}
	}()
	return ch
}

// max_concurrency = 1 and queue = 1: one request runs, one waits, the
// next is refused at once with 503, Retry-After and the queue depth; the
// two accepted ones complete.
func TestAdmission_QueueFull(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", "sleep = \"stop\"\nmax_concurrency = 1\nqueue = 1", "--ttft", "1500ms")
	n := harness.Start(t, harness.Options{Models: m})
	ctx := ctxFor(t, 30*time.Second)
	wake(t, n, "m")

	running := fire(n, t, harness.Chat("m", false, 2))
	eventually(t, 10*time.Second, "first request running", func() bool { return eng.stats(t).Running == 1 })
	queued := fire(n, t, harness.Chat("m", false, 2))
	eventually(t, 10*time.Second, "second request queued", func() bool { return modelStatus(t, n, "m").QueueDepth == 1 })

	start := time.Now()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 2))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the refusal took %s; a full queue answers at once", d)
	}
	msg := wantError(t, resp, body, http.StatusServiceUnavailable, "queue_full")
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("X-Queue-Depth") != "1" {
		t.Errorf("503 headers %v, want Retry-After and X-Queue-Depth 1", resp.Header)
	}
	if !strings.Contains(msg, "queue full") {
		t.Errorf("message %q", msg)
	}
	for _, ch := range []<-chan result{running, queued} {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		wantCompletion(t, r.resp, r.body)
	}
	if s := eng.stats(t); s.Completions != 2 {
		t.Errorf("engine completions = %d, want 2", s.Completions)
	}
}

// 100 concurrent requests to a sleeping model share one wake: the engine
// is started once, and every request succeeds and says it waited.
func TestAdmission_WakeStorm(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", `sleep = "stop"`, "--startup-delay", "500ms", "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m})
	const clients = 100
	var wg sync.WaitGroup
	results := make([]result, clients)
	ctx := ctxFor(t, 60*time.Second)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, b, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 2))
			results[i] = result{resp, b, err}
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		wantCompletion(t, r.resp, r.body)
		if r.resp.Header.Get("X-Napd-Wake-Ms") == "" {
			t.Errorf("request %d: no X-Napd-Wake-Ms: %v", i, r.resp.Header)
		}
	}
	if c := engineStarts(n, "m"); c != 1 {
		t.Errorf("engine started %d times, want 1", c)
	}
	if s := eng.stats(t); s.Completions != clients {
		t.Errorf("engine completions = %d, want %d", s.Completions, clients)
	}
}

// An engine that never gets healthy: after wake_attempts (3) the waiting
// request gets 503 naming the reason and the count, and so does the next.
func TestAdmission_FailingEngine(t *testing.T) {
	t.Parallel()
	m, _ := demo(t, "m", `sleep = "stop"`, "--startup-delay", "50ms", "--fail-start")
	n := harness.Start(t, harness.Options{Models: m})
	ctx := ctxFor(t, 60*time.Second)
	for i, what := range []string{"the waiting request", "a later request"} {
		resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 2))
		if err != nil {
			t.Fatal(err)
		}
		msg := wantError(t, resp, body, http.StatusServiceUnavailable, "model_failed")
		if !strings.Contains(msg, "3 of 3 attempts") || !strings.Contains(msg, "exit") {
			t.Errorf("%s: message %q, want the reason (exit) and \"3 of 3 attempts\"", what, msg)
		}
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After: %v", what, resp.Header)
		}
		if i == 0 {
			if c := engineStarts(n, "m"); c != 3 {
				t.Errorf("engine started %d times, want 3", c)
			}
		}
	}
	if c := engineStarts(n, "m"); c != 3 {
		t.Errorf("a failed model was started again: %d starts, want 3", c)
	}
	if st := modelStatus(t, n, "m"); st.State != "failed" {
		t.Errorf("state %q, want failed", st.State)
	}
}

// One deadline: an engine that never gets healthy and an engine that
// answers too slowly both end in 504 when X-Request-Timeout runs out, not
// at wake_timeout or whenever the engine is done.
func TestAdmission_DeadlineIs504(t *testing.T) {
	t.Parallel()
	hang, _ := demo(t, "hang", `sleep = "stop"`, "--hang-health")
	slow, _ := demo(t, "slow", `sleep = "stop"`, "--ttft", "5s")
	n := harness.Start(t, harness.Options{Models: hang + slow})
	ctx := ctxFor(t, 30*time.Second)
	wake(t, n, "slow")

	for _, model := range []string{"hang", "slow"} {
		t.Run(model, func(t *testing.T) {
			start := time.Now()
			resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat(model, false, 2), "X-Request-Timeout", "1s")
			d := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			wantError(t, resp, body, http.StatusGatewayTimeout, "timeout")
			if d < time.Second || d > 2500*time.Millisecond {
				t.Errorf("504 after %s, want at the 1s deadline", d)
			}
			if resp.Header.Get("X-Queue-Depth") == "" {
				t.Errorf("504 without X-Queue-Depth: %v", resp.Header)
			}
		})
	}
	if st := modelStatus(t, n, "hang"); st.State != "waking" {
		t.Errorf("hang: state %q; a request's deadline must not end the wake", st.State)
	}
}
