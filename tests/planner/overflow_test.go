package planner

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// remoteBox is a second napd on loopback, the overflow target: qwen
// answers at once, slow after 3 s; both awake from its start.
func remoteBox(t *testing.T) *harness.Napd {
	t.Helper()
	b := harness.Start(t, harness.Options{
		Models: harness.DemoModel("qwen", "warm_on_start = true", "--ttft", "10ms") +
			harness.DemoModel("slow", "warm_on_start = true", "--ttft", "3s"),
	})
	for _, m := range []string{"qwen", "slow"} {
		b.WaitModel(m, 30*time.Second, func(s control.ModelStatus) bool { return s.State == "awake" })
	}
	return b
}

// remoteModel is a [models.cloud] on napd B's model served.
func remoteModel(b *harness.Napd, served string) string {
	return fmt.Sprintf("[models.cloud]\nurl = \"http://%s/v1\"\nserved_name = %q\nhealth_interval = \"1s\"\n", b.Addr, served)
}

func sendWith(t *testing.T, n *harness.Napd, model string, header ...string) (*http.Response, string) {
	t.Helper()
	resp, body, err := n.Post(t.Context(), "/v1/chat/completions", harness.Chat(model, false, 2), header...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// Two 16 GiB models on one 24 GiB fake GPU; a streams for long. A request
// for b with an 8 s deadline waits here while b could still wake in time
// (a is asked to yield for it, b's learned wake is about 2 s), then, once
// the wake can no longer end before its deadline, goes to the remote napd
// and is answered 200 within its deadline, saying where it went; b's
// engine is not started for it, a's stream ends whole (its yield is taken
// back), and the metrics count the overflow.
func TestOverflow_LateRequestGoesToTheRemote(t *testing.T) {
	box := remoteBox(t)
	env := fakeGPU(t, 24<<10, map[string]int{"a": 16 << 10, "b": 16 << 10})
	n := harness.Start(t, harness.Options{Env: env,
		Models: demo("a", `gpu_memory = "16GiB"`) +
			harness.DemoModel("b", "sleep = \"stop\"\ngpus = [0]\ngpu_memory = \"16GiB\"\noverflow = [\"cloud\"]",
				"--startup-delay", "2s", "--ttft", "10ms") +
			remoteModel(box, "qwen"),
	})
	requireFakeSMI(t, n)
	t.Cleanup(func() { neverTogether(t, env) })
	n.WaitModel("cloud", 30*time.Second, func(s control.ModelStatus) bool { return s.State == "awake" })
	// b's wake and a's requests are learned.
	for _, m := range []string{"b", "a", "a"} {
		if resp, body := sendWith(t, n, m); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Napd-Served-By") != "" {
			t.Fatalf("%s: %d %s", m, resp.StatusCode, body)
		}
	}
	rest := stream(t, n, "a", 500) // 10 s of tokens
	start := time.Now()
	resp, body := sendWith(t, n, "b", "X-Request-Timeout", "8s")
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Napd-Served-By") != "cloud" {
		t.Fatalf("b behind a's stream: %d, served by %q: %s", resp.StatusCode, resp.Header.Get("X-Napd-Served-By"), body)
	}
	t.Logf("b answered by the remote after %s", took)
	if took >= 8*time.Second || took < 2*time.Second {
		t.Errorf("b answered after %s: want after a wait here (a yield was due), within its 8 s deadline", took)
	}
	if !strings.Contains(body, `"model":"b"`) {
		t.Errorf("the answer's model is not the one asked for: %s", body)
	}
	if whole, _ := rest(); !whole {
		t.Error("a's stream did not end whole")
	}
	if got := strings.Count(n.Log(), `msg="engine started" backend=exec model=b`); got != 1 {
		t.Errorf("b's engine started %d times, want once (its warm-up)", got)
	}
	if !metric(t, n, `napd_overflow_requests_total{code="200",model="b",target="cloud"} 1`) {
		t.Errorf("no overflow counted:\n%s", n.MetricsText())
	}
	if !strings.Contains(n.Log(), "served_by=cloud") {
		t.Error("the request's log line does not say where it went")
	}
}

// overflow_when = "refused": a request for b behind a busy a is not sent
// away (it ends in 504 at its deadline), but one refused because a pinned
// model holds the GPU is. An Idempotency-Key holds across the move: a
// retry while the overflowed request runs at the remote joins it, and the
// remote sees one request.
func TestOverflow_RefusedOnlyAndIdempotentRetry(t *testing.T) {
	box := remoteBox(t)
	env := fakeGPU(t, 24<<10, map[string]int{"a": 16 << 10, "b": 16 << 10, "p": 16 << 10})
	n := harness.Start(t, harness.Options{Env: env,
		Models: demo("a", `gpu_memory = "16GiB"`) + demo("p", "gpu_memory = \"16GiB\"\npinned = true") +
			demo("b", "gpu_memory = \"16GiB\"\noverflow = [\"cloud\"]\noverflow_when = \"refused\"") +
			remoteModel(box, "slow"),
	})
	requireFakeSMI(t, n)
	t.Cleanup(func() { neverTogether(t, env) })
	n.WaitModel("cloud", 30*time.Second, func(s control.ModelStatus) bool { return s.State == "awake" })

	if resp, body := sendWith(t, n, "a"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a: %d %s", resp.StatusCode, body)
	}
	rest := stream(t, n, "a", 200)
	resp, body := sendWith(t, n, "b", "X-Request-Timeout", "3s")
	if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get("X-Napd-Served-By") != "" {
		t.Fatalf("b behind busy a, refused only: %d (served by %q), want 504 here: %s", resp.StatusCode, resp.Header.Get("X-Napd-Served-By"), body)
	}
	if whole, _ := rest(); !whole {
		t.Fatal("a's stream did not end whole")
	}
	if resp, body := sendWith(t, n, "p"); resp.StatusCode != http.StatusOK {
		t.Fatalf("p: %d %s", resp.StatusCode, body)
	}

	type answer struct {
		status         int
		by, replayed   string
		body           string
		err            error
		sentAt, doneAt time.Time
	}
	answers := make([]answer, 2)
	var wg sync.WaitGroup
	send := func(i int) {
		defer wg.Done()
		a := answer{sentAt: time.Now()}
		resp, body, err := n.Post(t.Context(), "/v1/chat/completions", harness.Chat("b", false, 2), "Idempotency-Key", "k-36")
		a.err, a.doneAt = err, time.Now()
		if err == nil {
			a.status, a.by, a.replayed, a.body = resp.StatusCode, resp.Header.Get("X-Napd-Served-By"), resp.Header.Get("X-Napd-Replayed"), string(body)
		}
		answers[i] = a
	}
	wg.Add(1)
	go send(0)
	box.WaitModel("slow", 30*time.Second, func(s control.ModelStatus) bool { return s.Leases == 1 }) // the first is at the remote
	wg.Add(1)
	go send(1)
	wg.Wait()
	first, retry := answers[0], answers[1]
	if first.err != nil || first.status != http.StatusOK || first.by != "cloud" {
		t.Fatalf("b refused for the pinned p: %+v, want 200 served by cloud", first)
	}
	if retry.err != nil || retry.status != http.StatusOK || retry.replayed != "true" || retry.by != "cloud" || retry.body != first.body {
		t.Errorf("the retry during the overflow: %+v, want the first's answer replayed", retry)
	}
	if !metric(t, box, `napd_requests_total{client="",code="200",model="slow"} 1`) {
		t.Errorf("the remote did not see exactly one request:\n%s", box.MetricsText())
	}
	if strings.Contains(n.Log(), `msg="engine started" backend=exec model=b`) {
		t.Error("b's engine was started")
	}
}
