package gateway_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// Two concurrent requests with one Idempotency-Key: the engine serves one,
// both get its body; a later retry is replayed without reaching the engine.
// A request cancelled by its client is not remembered: its retry runs.
func TestIdempotency_JoinReplayAndCancel(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", `sleep = "stop"`, "--ttft", "1s")
	n := harness.Start(t, harness.Options{Models: m})
	wake(t, n, "m")
	key := []string{"Idempotency-Key", "order-42"}

	first := fire(n, t, harness.Chat("m", false, 4), key...)
	eventually(t, 10*time.Second, "first request running", func() bool { return eng.stats(t).Running == 1 })
	second := fire(n, t, harness.Chat("m", false, 4), key...)
	a, b := <-first, <-second
	if a.err != nil || b.err != nil {
		t.Fatal(a.err, b.err)
	}
	ca, cb := wantCompletion(t, a.resp, a.body), wantCompletion(t, b.resp, b.body)
	if !bytes.Equal(a.body, b.body) {
		t.Errorf("joined request got a different body:\n%s\n%s", a.body, b.body)
	}
	if s := eng.stats(t); s.Completions != 1 {
		t.Fatalf("engine completions = %d, want 1 for two joined requests", s.Completions)
	}

	ctx := ctxFor(t, 30*time.Second)
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4), key...)
	if err != nil {
		t.Fatal(err)
	}
	c := wantCompletion(t, resp, body)
	if c.ID != ca.ID || c.ID != cb.ID || resp.Header.Get("X-Napd-Replayed") != "true" {
		t.Errorf("retry: id %s (first %s), X-Napd-Replayed %q", c.ID, ca.ID, resp.Header.Get("X-Napd-Replayed"))
	}
	if s := eng.stats(t); s.Completions != 1 {
		t.Fatalf("engine completions = %d after a replay, want 1", s.Completions)
	}

	// The same key from a request that is cancelled mid-flight.
	other := []string{"Idempotency-Key", "order-43"}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancelled := make(chan error, 1)
	go func() {
		_, _, err := n.Post(cctx, "/v1/chat/completions", harness.Chat("m", false, 4), other...)
		cancelled <- err
	}()
	// Cancelled once the engine runs it (its answer is 1s away), not after
	// a fixed time that a busy machine may spend before it gets there.
	eventually(t, 10*time.Second, "request to cancel running", func() bool { return eng.stats(t).Running == 1 })
	cancel()
	if err := <-cancelled; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	eventually(t, 5*time.Second, "cancelled lease released", func() bool { return modelStatus(t, n, "m").Leases == 0 })
	resp, body, err = n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4), other...)
	if err != nil {
		t.Fatal(err)
	}
	wantCompletion(t, resp, body)
	if resp.Header.Get("X-Napd-Replayed") != "" {
		t.Errorf("the retry of a cancelled request was replayed: %v", resp.Header)
	}
	if s := eng.stats(t); s.Completions != 2 || s.RequestsCancelled != 1 {
		t.Errorf("engine stats %+v, want 2 completions and 1 cancelled", s)
	}
}
