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

const (
	ideKey     = "sk-ide-0123456789"
	nightlyKey = "sk-nightly-0123456789"
)

// priorityKeys writes a keys file with an interactive and a batch key.
func priorityKeys(t *testing.T) string {
	t.Helper()
	keys := filepath.Join(t.TempDir(), "keys")
	data := "ide:" + ideKey + " priority=interactive\nnightly:" + nightlyKey + " priority=batch\n"
	if err := os.WriteFile(keys, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return keys
}

// Within a model a higher class is admitted first: with one slot held by
// a batch request and three more batch requests queued, the interactive
// key's request is served next, before the batch requests that arrived
// first. Each answer names the class it ran in; an interactive key may
// lower its own (X-Napd-Priority: batch), and is then queued as batch.
// With engine_priority the engine (here vLLM's emulator with
// --scheduling-policy priority) sees the class's priority field.
func TestPriority_QueueAdmitsTheHigherClassFirst(t *testing.T) {
	t.Parallel()
	// Each answer takes about 200 ms: 4 tokens at 20 per second.
	m, eng := demo(t, "m", "sleep = \"stop\"\nmax_concurrency = 1\nqueue = 20\nengine_priority = true",
		"--ttft", "0", "--tokens-per-second", "20", "--scheduling-policy", "priority")
	n := harness.Start(t, harness.Options{Models: m, Gateway: "api_keys_file = " + strconv.Quote(priorityKeys(t))})
	ctx := ctxFor(t, 2*time.Minute)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	send := func(who, key string, header ...string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4), append([]string{"Authorization", "Bearer " + key}, header...)...)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %v %v %s", who, resp, err, body)
				return
			}
			want := "batch"
			if who == "ide" {
				want = "interactive"
			}
			if got := resp.Header.Get("X-Napd-Priority"); got != want {
				t.Errorf("%s ran as %q, want %q", who, got, want)
			}
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
		}()
	}
	send("batch0", nightlyKey)
	eventually(t, time.Minute, "the first batch request in flight", func() bool { return n.ModelStatus("m").Leases == 1 && n.ModelStatus("m").QueueDepth == 0 })
	send("ide-lowered", ideKey, "X-Napd-Priority", "batch")
	eventually(t, time.Minute, "queued", func() bool { return n.ModelStatus("m").QueueDepth == 1 })
	for i := 1; i <= 3; i++ {
		send("batch"+strconv.Itoa(i), nightlyKey)
		eventually(t, time.Minute, "queued", func() bool { return n.ModelStatus("m").QueueDepth == 1+i })
	}
	send("ide", ideKey)
	wg.Wait()
	if len(order) != 6 || order[0] != "batch0" || order[1] != "ide" {
		t.Errorf("completion order %v: want batch0 (in flight), then ide, then the batch class", order)
	}
	// The engine saw napd's priority field: 0 for interactive, 2 for
	// batch (its place in [policy] priorities).
	if got := eng.stats(t).Priorities; got["0"] != 1 || got["2"] != 5 || len(got) != 2 {
		t.Errorf("the engine saw priorities %v, want 0 once and 2 five times", got)
	}
}

// Without engine_priority napd adds nothing to the body: an engine that
// refuses the field (vLLM without --scheduling-policy priority) serves
// every class, and a client's own field reaches it as sent.
func TestPriority_NothingAddedWithoutEnginePriority(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", "sleep = \"stop\"", "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m, Gateway: "api_keys_file = " + strconv.Quote(priorityKeys(t))})
	ctx := ctxFor(t, time.Minute)
	for _, key := range []string{ideKey, nightlyKey} {
		if resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 1), "Authorization", "Bearer "+key); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v %s", key, resp, err, body)
		}
	}
	if got := eng.stats(t).Priorities; got["none"] != 2 || len(got) != 1 {
		t.Errorf("the engine saw priorities %v, want no field twice", got)
	}
	resp, body, err := n.Post(ctx, "/v1/chat/completions",
		`{"model":"m","max_tokens":1,"priority":3,"messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer "+ideKey)
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a client's own priority field: %v %v %s, want the engine's 400", resp, err, body)
	}
}
