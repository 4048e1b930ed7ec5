package gateway_test

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// A stream three times longer than the idle timeout completes, and the
// model stays awake under it; once it ends, the model goes to sleep.
func TestStream_OutlivesIdleTimeout(t *testing.T) {
	t.Parallel()
	m, _ := demo(t, "m", "sleep = \"stop\"\nidle_timeout = \"1s\"", "--ttft", "0", "--tokens-per-second", "10")
	n := harness.Start(t, harness.Options{Models: m})
	wake(t, n, "m")

	start := time.Now()
	resp := stream(t, ctxFor(t, 30*time.Second), n, harness.Chat("m", true, 30))
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	chunks, done := 0, false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: "):
			chunks++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("stream cut after %d chunks (%s): %v", chunks, time.Since(start), err)
	}
	d := time.Since(start)
	if !done || chunks < 30 || d < 2500*time.Millisecond {
		t.Fatalf("stream: %d chunks, [DONE] %t, %s; want 30+ chunks over ~3s", chunks, done, d)
	}
	if strings.Contains(n.Log(), `msg="putting to sleep"`) {
		t.Fatal("the model was put to sleep while a stream held its lease")
	}
	// Idle now: the idle timeout (1s) plus a planner tick puts it to sleep.
	eventually(t, 10*time.Second, "sleep after the stream ended", func() bool {
		return modelStatus(t, n, "m").State == "sleeping"
	})
}

// A client that leaves mid-stream cancels the engine's generation and
// releases its lease.
func TestStream_DisconnectCancelsUpstream(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", `sleep = "stop"`, "--ttft", "0", "--tokens-per-second", "20")
	n := harness.Start(t, harness.Options{Models: m})
	wake(t, n, "m")

	ctx, cancel := context.WithCancel(ctxFor(t, 30*time.Second))
	resp := stream(t, ctx, n, harness.Chat("m", true, 1000)) // 50 s if not cancelled
	r := bufio.NewReader(resp.Body)
	for i := 0; i < 3; i++ {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if l := modelStatus(t, n, "m").Leases; l != 1 {
		t.Errorf("leases mid-stream = %d, want 1", l)
	}
	cancel()
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	eventually(t, 5*time.Second, "engine saw the stream cancelled", func() bool {
		s := eng.stats(t)
		return s.StreamsCancelled == 1 && s.Running == 0
	})
	eventually(t, 5*time.Second, "lease released", func() bool { return modelStatus(t, n, "m").Leases == 0 })
	out, err := n.Napctl("status", "--json")
	if err != nil || !strings.Contains(out, `"leases": 0`) {
		t.Errorf("napctl status --json: %v\n%s", err, out)
	}
	if s := eng.stats(t); s.Completions != 0 {
		t.Errorf("engine completed %d requests, want 0", s.Completions)
	}
}
