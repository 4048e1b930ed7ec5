//go:build linux

// Package chaos runs napd under a mix of faults for a bounded time: three
// models with one-second idle timeouts, clients that disconnect at random,
// retries with Idempotency-Key, engines SIGKILLed every few seconds or
// frozen with SIGSTOP, forced sleeps and a reload; then a SIGTERM, and a
// SIGKILL of napd itself followed by a restart. It asserts what must hold
// whatever happens: no request hangs, every answer is well formed, no
// answer comes from an engine instance napd has not verified, a cut answer
// is never replayed, at most one 502 per engine death on average, and
// after quiescence no lease is held, every model sleeps and no process is
// left behind.
package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

var raceEnabled bool

var models = []string{"a", "b", "c"}

// loadingBody is what a demo engine answers before it has loaded: a
// response carrying it came from an instance napd had not verified.
const loadingBody = "the engine is loading"

// counts holds what the clients saw.
type counts struct {
	mu         sync.Mutex
	status     map[int]int
	cut        int // streams cut mid-answer (a client read error)
	left       int // requests whose client left on purpose
	hung       []string
	malformed  []string
	unverified []string
	replays    int
	badReplays []string
}

func (c *counts) add(f func(*counts)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

func TestChaos(t *testing.T) {
	requests, clients := 2000, 6
	if raceEnabled {
		requests, clients = 300, 3
	}
	if testing.Short() {
		requests = 200
	}
	mark := fmt.Sprintf("chaos-%d", time.Now().UnixNano())
	var cfg strings.Builder
	for _, m := range models {
		// The shell leaves a helper process (sleep) beside the engine it
		// execs, as engines that spawn workers do.
		fmt.Fprintf(&cfg, `[models.%s]
command = ["sh", "-c", "sleep 600 & exec ${BIN}/napd-demo-engine --host 127.0.0.1 --port ${PORT} --model %s --startup-delay 300ms --ttft 10ms --tokens-per-second 200"]
environment = { %s = %q }
idle_timeout = "1s"
sleep = "stop"
stop_timeout = "2s"
max_concurrency = 4
queue = 64

`, m, m, harness.MarkEnv, mark)
	}
	n := harness.Start(t, harness.Options{
		Models:   cfg.String(),
		LogLevel: "info",
		Policy: `drain_timeout = "3s"
wake_timeout = "20s"
wake_attempts = 3
allow_untracked_unload = false
`,
	})
	t.Cleanup(func() {
		for _, pid := range harness.Marked(mark) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})

	c := &counts{status: make(map[int]int)}
	var sent atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
			for sent.Add(1) <= int64(requests) {
				one(t, n, rng, c)
			}
		})
	}
	faultsDone := make(chan struct{})
	var kills, freezes, sleeps atomic.Int64
	stop := make(chan struct{})
	go func() {
		defer close(faultsDone)
		faults(t, n, mark, stop, &kills, &freezes, &sleeps)
	}()
	wg.Wait()
	close(stop)
	<-faultsDone
	took := time.Since(start)

	c.mu.Lock()
	t.Logf("%d requests in %s: statuses %v, %d cut, %d left on purpose, %d replays; %d engine kills, %d freezes, %d forced sleeps",
		requests, took.Round(time.Millisecond), c.status, c.cut, c.left, c.replays, kills.Load(), freezes.Load(), sleeps.Load())
	for _, list := range []struct {
		what string
		l    []string
	}{{"hung", c.hung}, {"malformed", c.malformed}, {"from an unverified engine instance", c.unverified}, {"wrongly replayed", c.badReplays}} {
		if len(list.l) > 0 {
			t.Errorf("%d responses %s, e.g. %s", len(list.l), list.what, list.l[0])
		}
	}
	deaths := kills.Load() + freezes.Load()
	if bad := int64(c.status[http.StatusBadGateway]); deaths > 0 && bad > deaths {
		t.Errorf("%d 502s for %d engine deaths: more than one per death", bad, deaths)
	}
	c.mu.Unlock()
	faults := make(map[string]int)
	for _, line := range harness.Lines(n.Log()) {
		if _, f, ok := strings.Cut(line, "engine_fault="); ok {
			faults[strings.Fields(f)[0]]++
		}
	}
	t.Logf("engine faults napd logged: %v", faults)

	// Quiescence: nothing held, everything asleep.
	quiet(t, n)

	// SIGTERM leaves nothing behind.
	n.Signal(syscall.SIGTERM)
	if err := n.Wait(60 * time.Second); err != nil {
		t.Errorf("napd exit after SIGTERM: %v", err)
	}
	if left := harness.Marked(mark); len(left) > 0 {
		t.Errorf("after SIGTERM %d engine processes run: %v", len(left), left)
	}

	// SIGKILL, restart, SIGTERM: nothing behind either.
	n.Launch()
	for _, m := range models {
		if resp, body, err := n.Post(context.Background(), "/v1/chat/completions", harness.Chat(m, false, 2)); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s after the restart: %v %v %s", m, err, resp, body)
		}
	}
	n.Kill()
	n.Launch()
	n.Signal(syscall.SIGTERM)
	if err := n.Wait(60 * time.Second); err != nil {
		t.Errorf("napd exit after SIGKILL, restart, SIGTERM: %v", err)
	}
	if left := harness.Marked(mark); len(left) > 0 {
		t.Errorf("after SIGKILL, restart and SIGTERM %d engine processes run: %v", len(left), left)
	}
}

// one sends one request (sometimes twice, with an Idempotency-Key) and
// records what came back.
func one(t *testing.T, n *harness.Napd, rng *rand.Rand, c *counts) {
	model := models[rng.IntN(len(models))]
	stream := rng.IntN(3) > 0
	body := harness.Chat(model, stream, 1+rng.IntN(40))
	timeout := time.Duration(2+rng.IntN(8)) * time.Second
	header := http.Header{"Content-Type": {"application/json"}, "X-Request-Timeout": {fmt.Sprint(timeout.Seconds())}}
	if rng.IntN(10) == 0 {
		header.Set("Idempotency-Key", fmt.Sprintf("k-%d", rng.Uint64()))
	}
	leave := time.Duration(0)
	if rng.IntN(10) == 0 {
		leave = time.Duration(rng.IntN(300)) * time.Millisecond
	}
	first := send(n, body, header, timeout, leave)
	record(c, first)
	if header.Get("Idempotency-Key") == "" || first.left {
		return
	}
	again := send(n, body, header, timeout, 0)
	record(c, again)
	if again.replayed {
		c.add(func(c *counts) {
			c.replays++
			if !first.complete || !bytes.Equal(first.body, again.body) {
				c.badReplays = append(c.badReplays, fmt.Sprintf("first %d complete=%v %q, replay %q", first.status, first.complete, clip(first.body), clip(again.body)))
			}
		})
	}
}

type answer struct {
	status   int
	body     []byte
	complete bool // a full, well-formed answer
	cut      bool // a stream the client saw cut
	left     bool // the client left on purpose
	hung     bool
	replayed bool
	problem  string
}

func send(n *harness.Napd, body string, header http.Header, timeout, leave time.Duration) answer {
	// The client's own bound: the request's deadline plus slack. Reaching
	// it means napd let the request hang.
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	var left atomic.Bool
	if leave > 0 {
		timer := time.AfterFunc(leave, func() { left.Store(true); cancel() })
		defer timer.Stop()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.URL("/v1/chat/completions"), strings.NewReader(body))
	req.Header = header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		switch {
		case left.Load():
			return answer{left: true}
		case errors.Is(err, context.DeadlineExceeded):
			return answer{hung: true, problem: "no response: " + err.Error()}
		}
		return answer{problem: "request failed: " + err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: b, replayed: resp.Header.Get("X-Napd-Replayed") == "true"}
	switch {
	case left.Load():
		a.left = true
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		a.hung, a.problem = true, "body never ended"
	case err != nil:
		a.cut = true // the gateway cut the answer (engine died, deadline)
	default:
		a.problem = wellFormed(resp, b)
		a.complete = a.problem == "" && resp.StatusCode == http.StatusOK
	}
	return a
}

// wellFormed checks a response read to its end; "" when it is.
func wellFormed(resp *http.Response, b []byte) string {
	if bytes.Contains(b, []byte(loadingBody)) {
		return "unverified: " + clip(b)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
			return fmt.Sprintf("status %d without the OpenAI error shape: %s", resp.StatusCode, clip(b))
		}
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			return "503 without Retry-After: " + clip(b)
		}
		return ""
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
			return "stream ended without [DONE]: " + clip(b)
		}
		return ""
	}
	var v struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if json.Unmarshal(b, &v) != nil || len(v.Choices) == 0 {
		return "200 that is no chat completion: " + clip(b)
	}
	return ""
}

func record(c *counts, a answer) {
	c.add(func(c *counts) {
		switch {
		case a.left:
			c.left++
			return
		case a.hung:
			c.hung = append(c.hung, a.problem)
			return
		}
		if a.status != 0 {
			c.status[a.status]++
		}
		if a.cut {
			c.cut++
		}
		switch {
		case strings.HasPrefix(a.problem, "unverified"):
			c.unverified = append(c.unverified, a.problem)
		case a.problem != "":
			c.malformed = append(c.malformed, a.problem)
		}
	})
}

func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// faults runs the fault mix until stop: an engine SIGKILLed every couple
// of seconds, one frozen for a while now and then, forced sleeps, and a
// reload.
func faults(t *testing.T, n *harness.Napd, mark string, stop <-chan struct{}, kills, freezes, sleeps *atomic.Int64) {
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	reloaded := false
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(700+rng.IntN(800)) * time.Millisecond):
		}
		model := models[rng.IntN(len(models))]
		switch {
		case i%3 == 0:
			if pid := enginePID(mark, model); pid > 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
				kills.Add(1)
			}
		case i%7 == 1:
			if pid := enginePID(mark, model); pid > 0 && syscall.Kill(pid, syscall.SIGSTOP) == nil {
				freezes.Add(1)
				frozen := time.Duration(500+rng.IntN(1500)) * time.Millisecond
				time.AfterFunc(frozen, func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
			}
		case i%3 == 1:
			if _, err := n.Napctl("sleep", model); err == nil {
				sleeps.Add(1)
			}
		case i > 10 && !reloaded:
			reloaded = true
			n.Signal(syscall.SIGHUP)
		}
	}
}

// enginePID is the pid of model's running demo engine, 0 if none runs.
func enginePID(mark, model string) int {
	for _, pid := range harness.Marked(mark) {
		cmd, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 0 && strings.HasSuffix(args[0], "napd-demo-engine") && slices.Contains(args, model) {
			return pid
		}
	}
	return 0
}

// quiet waits until no model holds a lease and every model sleeps.
func quiet(t *testing.T, n *harness.Napd) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		busy := ""
		for _, m := range models {
			st := n.ModelStatus(m)
			if st.Leases != 0 || st.State != "sleeping" {
				busy = fmt.Sprintf("%s: %d leases, %s", m, st.Leases, st.State)
				break
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no quiescence within a minute: %s", busy)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
