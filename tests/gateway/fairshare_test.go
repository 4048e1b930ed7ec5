package gateway_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// With API keys (fair_share "auto"), a burst of requests from one key does
// not keep another key's request waiting behind all of it: with one slot,
// bob's single request, queued behind five of alice's, is served next.
func TestFairShare_BurstFromOneKey(t *testing.T) {
	t.Parallel()
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("alice:sk-alice-0123456789\nbob:sk-bob-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Each answer takes about 200 ms: 4 tokens at 20 per second.
	m, _ := demo(t, "m", "sleep = \"stop\"\nmax_concurrency = 1\nqueue = 20", "--ttft", "0", "--tokens-per-second", "20")
	n := harness.Start(t, harness.Options{Models: m, Gateway: "api_keys_file = " + strconv.Quote(keys)})
	ctx := ctxFor(t, 2*time.Minute)

	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	send := func(who, key string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4), "Authorization", "Bearer "+key)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %v %v %s", who, resp, err, body)
				return
			}
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
		}()
	}
	for range 6 {
		send("alice", "sk-alice-0123456789")
	}
	// One of alice's in flight (or waking the model), five queued.
	eventually(t, time.Minute, "alice's burst queued", func() bool { return n.ModelStatus("m").QueueDepth == 5 })
	send("bob", "sk-bob-0123456789")
	wg.Wait()
	pos := -1
	for i, who := range order {
		if who == "bob" {
			pos = i
		}
	}
	// alice's first request was already served (or in flight) when bob
	// arrived; bob's turn comes right after it, not after the other five.
	if pos < 0 || pos > 2 {
		t.Errorf("completion order %v: bob finished at position %d, want right after alice's first", order, pos)
	}
}

// A key's concurrency= is the key's own, beside the model's slots: with one
// stream of alice's open, her next request gets 429 in OpenAI's shape while
// bob's goes through; when her stream ends, she may send again.
func TestKeys_ConcurrencyLimit(t *testing.T) {
	t.Parallel()
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("alice:sk-alice-0123456789 concurrency=1\nbob:sk-bob-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, _ := demo(t, "m", "sleep = \"stop\"\nmax_concurrency = 4", "--ttft", "0", "--tokens-per-second", "20")
	n := harness.Start(t, harness.Options{Models: m, Gateway: "api_keys_file = " + strconv.Quote(keys)})
	ctx := ctxFor(t, 2*time.Minute)
	alice := []string{"Authorization", "Bearer sk-alice-0123456789"}

	open := stream(t, ctx, n, harness.Chat("m", true, 200), alice...) // ten seconds of tokens
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 1), alice...)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, resp, body, http.StatusTooManyRequests, "key_concurrency_limit")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 1), "Authorization", "Bearer sk-bob-0123456789"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("bob while alice is at her limit: %v %v %s", resp, err, body)
	}
	open.Body.Close() // alice leaves her stream: her slot is free again
	eventually(t, time.Minute, "alice's slot freed", func() bool {
		resp, _, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 1), alice...)
		return err == nil && resp.StatusCode == http.StatusOK
	})
}
