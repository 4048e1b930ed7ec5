package planner

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// Two 16 GiB models on a 24 GiB GPU (1 GiB reserve): they never fit
// together, so every change of model is a swap.
func twoThatDoNotFit(t *testing.T, policy string, extraA, extraB string) *harness.Napd {
	t.Helper()
	return twoThatDoNotFitWith(t, harness.Options{Policy: policy}, extraA, extraB)
}

// twoThatDoNotFitWith is twoThatDoNotFit with more of napd's options.
func twoThatDoNotFitWith(t *testing.T, o harness.Options, extraA, extraB string) *harness.Napd {
	t.Helper()
	o.Env = append(o.Env, fakeGPU(t, 24<<10, map[string]int{"a": 16 << 10, "b": 16 << 10})...)
	o.Models = demo("a", `gpu_memory = "16GiB"`+"\n"+extraA) + demo("b", `gpu_memory = "16GiB"`+"\n"+extraB)
	n := harness.Start(t, o)
	requireFakeSMI(t, n)
	t.Cleanup(func() { neverTogether(t, o.Env) })
	return n
}

// send posts a chat request with its own deadline (X-Request-Timeout) and
// returns status, body and when it completed.
func send(n *harness.Napd, model string, stream bool, maxTokens int, deadline time.Duration) (int, string, time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline+30*time.Second)
	defer cancel()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat(model, stream, maxTokens),
		"X-Request-Timeout", deadline.String())
	if err != nil {
		return 0, "", time.Now(), err
	}
	return resp.StatusCode, string(body), time.Now(), nil
}

// logTime is the time of napd's first log line containing substr.
func logTime(t *testing.T, n *harness.Napd, substr string) time.Time {
	t.Helper()
	for _, line := range harness.Lines(n.Log()) {
		if !strings.Contains(line, substr) {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "time=") {
			break
		}
		at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time="))
		if err != nil {
			t.Fatalf("log time %q: %v", f[0], err)
		}
		return at
	}
	t.Fatalf("the log has no %q", substr)
	return time.Time{}
}

// neverTogether checks that the fake GPU never saw the two models' engines
// at once (its nvidia-smi writes down any reading over its size): a model
// woke only once the other's engine had exited.
func neverTogether(t *testing.T, env []string) {
	t.Helper()
	for _, e := range env {
		if state, ok := strings.CutPrefix(e, "FAKE_SMI_STATE="); ok {
			if over, err := os.ReadFile(state + ".over"); err == nil {
				t.Fatalf("the GPU held both models:\n%s", over)
			}
			return
		}
	}
	t.Fatal("no FAKE_SMI_STATE")
}

func engineStarts(n *harness.Napd) int {
	return strings.Count(n.Log(), `msg="engine started"`)
}

// stream starts a streaming request for model and returns once its first
// bytes arrived; the returned func reads the rest and reports whether the
// stream ended whole ([DONE] after maxTokens chunks) and when.
func stream(t *testing.T, n *harness.Napd, model string, maxTokens int) func() (bool, time.Time) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, n.URL("/v1/chat/completions"), strings.NewReader(harness.Chat(model, true, maxTokens)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s stream: %d %s", model, resp.StatusCode, b)
	}
	r := bufio.NewReader(resp.Body)
	first, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("%s stream: %v", model, err)
	}
	return func() (bool, time.Time) {
		defer resp.Body.Close()
		rest, err := io.ReadAll(r)
		all := first + string(rest)
		return err == nil && strings.Contains(all, "data: [DONE]") && strings.Count(all, `"delta"`) >= maxTokens, time.Now()
	}
}

// Clients alternate a, b, a, b … concurrently: every request is served
// (no 503, no 504) and turns are batched, so the engines start far less
// often than requests arrive.
func TestRoom_AlternatingClientsAreAllServedWithFewSwaps(t *testing.T) {
	n := twoThatDoNotFit(t, "", "", "")
	const clients, each = 4, 10 // 20 requests for each model
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				model := []string{"a", "b"}[(c+i)%2]
				status, body, _, err := send(n, model, false, 2, 30*time.Second)
				if err != nil || status != http.StatusOK {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("client %d request %d (%s): %d %v %s", c, i, model, status, err, body))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed:\n%s", len(failures), clients*each, strings.Join(failures, "\n"))
	}
	starts := engineStarts(n)
	t.Logf("%d requests, %d engine starts", clients*each, starts)
	if starts > clients*each/2 {
		t.Errorf("%d engine starts for %d requests: turns are not batched", starts, clients*each)
	}
	if !metric(t, n, `napd_room_waits_total{model="a"}`) && !metric(t, n, `napd_room_waits_total{model="b"}`) {
		t.Error("metrics count no room waits")
	}
	if !metric(t, n, `napd_swaps_total{`) {
		t.Error("metrics count no swaps")
	}
}

// b waits while a streams for 3 s: b is served once a's stream has ended,
// and a's stream arrives whole.
func TestRoom_WaitsWhileTheHolderStreams(t *testing.T) {
	n := twoThatDoNotFit(t, "", "", "")
	finish := stream(t, n, "a", 150) // 3 s at 50 tokens per second
	type answer struct {
		status int
		body   string
		done   time.Time
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		status, body, done, err := send(n, "b", false, 2, 30*time.Second)
		got <- answer{status, body, done, err}
	}()
	// While b waits, napctl status and GET /v1/models say for whom.
	n.WaitLog(`msg="waiting for GPU memory" model=b`, 10*time.Second)
	out, err := n.Napctl("status")
	if err != nil || !strings.Contains(out, "b: 1 waiting for GPU memory held by busy a (16.0 GiB)") {
		t.Errorf("napctl status while b waits: %v\n%s", err, out)
	}
	resp, err := http.Get(n.URL("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	models, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(models), `"room_waiting":1,"waiting_for":"busy a (16.0 GiB)"`) {
		t.Errorf("GET /v1/models while b waits: %s", models)
	}
	b := <-got
	whole, aDone := finish()
	if b.err != nil || b.status != http.StatusOK {
		t.Fatalf("b: %d %v %s", b.status, b.err, b.body)
	}
	if !whole {
		t.Fatal("a's stream did not arrive whole")
	}
	if b.done.Before(aDone.Add(-50 * time.Millisecond)) {
		t.Errorf("b answered %s before a's stream ended", aDone.Sub(b.done))
	}
}

// a stays busy past b's deadline: b gets 504 naming a, and a's request is
// never cut.
func TestRoom_DeadlineRunsOutWhileTheHolderIsBusy(t *testing.T) {
	n := twoThatDoNotFit(t, "", "", "")
	finish := stream(t, n, "a", 300) // 6 s
	status, body, _, err := send(n, "b", false, 2, 2*time.Second)
	if err != nil || status != http.StatusGatewayTimeout || !strings.Contains(body, "waiting for GPU memory") || !strings.Contains(body, " a (16.0 GiB)") {
		t.Fatalf("b: %d %v %s\nwant 504 naming a", status, err, body)
	}
	if whole, _ := finish(); !whole {
		t.Fatal("a's stream was cut")
	}
	// Nobody waits any more: a, having yielded for b, serves again.
	if status, body, _, err := send(n, "a", false, 2, 10*time.Second); err != nil || status != http.StatusOK {
		t.Fatalf("a afterwards: %d %v %s", status, err, body)
	}
}

// A pinned holder can never make room: b is refused at once with 503, the
// message naming the pinned model, and a Retry-After.
func TestRoom_PinnedHolderRefusesAtOnce(t *testing.T) {
	n := twoThatDoNotFit(t, "", "pinned = true", "")
	if status, body, _, err := send(n, "a", false, 1, 10*time.Second); err != nil || status != http.StatusOK {
		t.Fatalf("a: %d %v %s", status, err, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("b", false, 1))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("503 after %s", took)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "pinned a (16.0 GiB)") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("b: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// "At once" is one measuring round, not a wait: well under the time a
	// wait would poll (the ticker's rounds are seconds apart).
	if took > 2*time.Second {
		t.Errorf("the refusal took %s", took)
	}
	if strings.Contains(n.Log(), "waiting for GPU memory") {
		t.Error("b waited although room could never appear")
	}
}

// a under a continuous stream of requests while b waits: a yields after
// yield_after (2 s here), b is served within that plus one of a's requests
// and the swap, and a's requests that arrive during the yield are queued,
// not refused, and served after b's batch.
func TestRoom_BusyHolderYieldsAfterYieldAfter(t *testing.T) {
	n := twoThatDoNotFit(t, harness.DefaultPolicy+"yield_after = \"2s\"\n", "", "")
	if status, body, _, err := send(n, "a", false, 1, 10*time.Second); err != nil || status != http.StatusOK {
		t.Fatalf("a: %d %v %s", status, err, body)
	}
	end := keepBusy(n, "a", 15, "X-Request-Timeout", "60s") // ~300 ms each
	time.Sleep(700 * time.Millisecond)                      // let a's streams run
	bSent := time.Now()
	status, body, bDone, err := send(n, "b", false, 2, 60*time.Second)
	as := end()
	if err != nil || status != http.StatusOK {
		t.Fatalf("b: %d %v %s", status, err, body)
	}
	wait := bDone.Sub(bSent)
	t.Logf("b served after %s", wait)
	// yield_after, one of a's requests (~0.3 s), a's stop and b's start.
	if wait > 2*time.Second+10*time.Second {
		t.Errorf("b waited %s", wait)
	}
	yielded := logTime(t, n, "decision.reason=yield")
	t.Logf("a yielded %s after b's request", yielded.Sub(bSent).Round(time.Millisecond))
	if yielded.Before(bSent.Add(2 * time.Second)) {
		t.Errorf("a yielded %s after b's request, before yield_after", yielded.Sub(bSent))
	}
	during := 0
	for _, r := range as {
		if r.status != http.StatusOK {
			t.Errorf("an a request got %d: requests arriving during the yield must be queued", r.status)
		}
		// Sent once a yielded (the log's clock has millisecond steps):
		// served only after b's batch.
		if r.sent.After(yielded.Add(10*time.Millisecond)) && r.sent.Before(bDone) {
			during++
			if r.done.Before(bDone) {
				t.Errorf("an a request sent %s after a yielded was served before b", r.sent.Sub(yielded))
			}
		}
	}
	t.Logf("%d a requests arrived during the yield, all served after b", during)
}

// served is one request of keepBusy's clients: when it was sent and
// answered, and its status (0: no answer).
type served struct {
	sent, done time.Time
	status     int
}

// keepBusy keeps model busy with requests of maxTokens (with header) from
// three clients started a third of a request apart, so that one is always
// in flight: a moment with none makes the model an idle holder, which
// sleeps at once for a waiter rather than yield. end stops the clients
// and returns what each request got.
func keepBusy(n *harness.Napd, model string, maxTokens int, header ...string) (end func() []served) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	stop := make(chan struct{})
	var mu sync.Mutex
	var got []served
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := served{sent: time.Now()}
				resp, _, err := n.Post(ctx, "/v1/chat/completions", harness.Chat(model, false, maxTokens), header...)
				r.done = time.Now()
				if err == nil {
					r.status = resp.StatusCode
				}
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
			}
		}()
	}
	return func() []served {
		close(stop)
		wg.Wait()
		cancel()
		return got
	}
}

// Without demand the idle minimum still holds: under GPU pressure a model
// just used is not put to sleep.
func TestRoom_IdleMinimumHoldsWithoutDemand(t *testing.T) {
	// a is configured at 8 GiB, so it fits, but holds 16 GiB once awake:
	// 8 GiB free is below the 10 GiB reserve.
	env := fakeGPU(t, 24<<10, map[string]int{"a": 16 << 10})
	n := harness.Start(t, harness.Options{
		Models:   demo("a", `gpu_memory = "8GiB"`),
		Env:      env,
		Pressure: `gpu_reserve = "10GiB"`,
	})
	requireFakeSMI(t, n)
	if status, body, _, err := send(n, "a", false, 1, 10*time.Second); err != nil || status != http.StatusOK {
		t.Fatalf("a: %d %v %s", status, err, body)
	}
	// The pressure is seen (and not relieved) while a is within its minimum.
	n.WaitLog("memory pressure not relieved", 20*time.Second)
	if strings.Contains(n.Log(), `msg="planner decision" model=a`) {
		t.Fatal("a was put to sleep within its idle minimum with nobody waiting")
	}
	if out, err := n.Napctl("status"); err != nil || !strings.Contains(out, "awake") {
		t.Errorf("a must stay awake: %v\n%s", err, out)
	}
}

// With wake_progress, a streaming request for b that waits while a streams
// gets its 200 early and SSE comments saying what it waits for, then b's
// stream whole.
func TestRoom_WakeProgressForAWaitingStream(t *testing.T) {
	n := twoThatDoNotFit(t, "", "", "wake_progress = true")
	finish := stream(t, n, "a", 300) // 6 s
	req, _ := http.NewRequest(http.MethodPost, n.URL("/v1/chat/completions"), strings.NewReader(harness.Chat("b", true, 5)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req) // returns with the early headers
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("b: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	first, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, ": b waits for GPU memory held by ") {
		t.Fatalf("first line %q, %v; want a progress comment", first, err)
	}
	rest, err := io.ReadAll(r)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Count(string(rest), `"delta"`) < 5 {
		t.Fatalf("b's stream after the comments: %v %q", err, rest)
	}
	if whole, _ := finish(); !whole {
		t.Fatal("a's stream was cut")
	}
}
