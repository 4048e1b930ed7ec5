package gateway_test

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// A canary prompt sent through every path (a wake, a plain answer, a
// stream, a replay, an engine error, a refusal) never appears in napd's
// output, even at log_level debug.
func TestPrivacy_CanaryNeverLogged(t *testing.T) {
	t.Parallel()
	m, _ := demo(t, "m", `sleep = "stop"`, "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m, LogLevel: "debug"})
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	canary := "canary-" + hex.EncodeToString(b)
	ctx := ctxFor(t, 30*time.Second)

	post := func(body string, header ...string) int {
		t.Helper()
		resp, _, err := n.Post(ctx, "/v1/chat/completions", body, header...)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	statuses := []int{
		post(chatWith("m", canary, false, 4)), // wakes the model
		post(chatWith("m", canary, false, 4), "Idempotency-Key", "k1"),
		post(chatWith("m", canary, false, 4), "Idempotency-Key", "k1"),                                    // replayed
		post(`{"model":"m","messages":[{"role":"user","content":"` + canary + `"}],"max_tokens":"many"}`), // engine's 400
		post(`{"model":"m","messages":"` + canary),                                                        // napd's 400
		post(chatWith("nope", canary, false, 4)),                                                          // 404
	}
	if want := []int{200, 200, 200, 400, 400, 404}; !slices.Equal(statuses, want) {
		t.Errorf("statuses %v, want %v", statuses, want)
	}
	resp := stream(t, ctx, n, chatWith("m", canary, true, 8))
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.URL("/upstream/m/v1/completions"),
		strings.NewReader(`{"model":"m","prompt":"`+canary+`","max_tokens":2}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("upstream: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	n.WaitLog("path=/upstream/m/v1/completions", 5*time.Second)
	if strings.Contains(n.Log(), canary) || strings.Contains(n.Log(), canary[len("canary-"):]) {
		t.Fatalf("napd's output contains the prompt's canary %s", canary)
	}
}
