package evidence_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// modelsReason is the napd.reason /v1/models lists for model.
func modelsReason(t *testing.T, n *harness.Napd, model string) string {
	t.Helper()
	resp, err := http.Get(n.URL("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID   string `json:"id"`
			Napd struct {
				Reason string `json:"reason"`
			} `json:"napd"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	for _, m := range list.Data {
		if m.ID == model {
			return m.Napd.Reason
		}
	}
	t.Fatalf("/v1/models lists no %s", model)
	return ""
}

// An engine with no metrics sleeps on its idle timeout by connection
// evidence; a client outside napd holding a keep-alive connection to its
// port keeps it awake (and status says who): it is use, so the model's
// idle time starts again with each round that sees it; once it closes, the
// model sleeps an idle timeout later.
func TestIdle_ConnectionEvidence(t *testing.T) {
	port := harness.FreePort(t)
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("g",
		fmt.Sprintf("port = %d\nidle_timeout = \"4s\"", port), "--flavor", "generic", "--ttft", "0")})
	if code, body := chat(t, n, "g"); code != http.StatusOK {
		t.Fatalf("chat = %d %s", code, body)
	}
	lastRequest := time.Now()
	outside, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer outside.Close()
	fmt.Fprintf(outside, "GET /v1/models HTTP/1.1\r\nHost: engine\r\n\r\n") // keep-alive by default
	want := fmt.Sprintf("in use outside napd: %s (pid %d, ", outside.LocalAddr(), os.Getpid())

	// The idle timeout passes since napd's own request while the client
	// stays connected: awake, status says why, and its idle time is not
	// counted from napd's request but from the rounds that saw the client.
	end := time.Now().Add(deadline)
	for {
		m := n.ModelStatus("g")
		if m.State != "awake" {
			t.Fatalf("model %s (%s) with a client outside napd connected", m.State, m.Reason)
		}
		if strings.Contains(m.Reason, want) && time.Since(lastRequest) > 8*time.Second {
			if m.IdleSince != nil && !m.IdleSince.After(lastRequest) {
				t.Errorf("idle since %s, napd's own request; want a later round that saw the client", m.IdleSince)
			}
			break
		}
		if time.Now().After(end) {
			t.Fatalf("status reason %q, want %q past the idle timeout", m.Reason, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := modelsReason(t, n, "g"); !strings.Contains(r, want) {
		t.Errorf("/v1/models reason %q, want %q", r, want)
	}

	// Once it closes, idleness is proven (napd's own pooled connections
	// to the engine do not count) and the model sleeps an idle timeout
	// later (less the 2 s between the planner's rounds).
	outside.Close()
	closed := time.Now()
	m := waitState(t, n, "g", "sleeping", deadline)
	if !strings.Contains(m.Reason, "idle timeout") {
		t.Errorf("asleep for %q, want the idle timeout", m.Reason)
	}
	if after := time.Since(closed); after < 2*time.Second {
		t.Errorf("asleep %s after the client left; want about an idle timeout (4s)", after)
	}
}

// Engines napd had no evidence for before: each flavor sleeps on its idle
// timeout (llama.cpp and TGI by their metrics, Ollama and a plain server by
// connections).
func TestIdle_EveryFlavorSleeps(t *testing.T) {
	models := harness.DemoModel("llama", `idle_timeout = "2s"`, "--flavor", "llamacpp", "--metrics", "--ttft", "0") +
		harness.DemoModel("llama-slots", `idle_timeout = "2s"`, "--flavor", "llamacpp", "--ttft", "0") +
		harness.DemoModel("tgi", `idle_timeout = "2s"`, "--flavor", "tgi", "--ttft", "0") +
		harness.DemoModel("ollama", "idle_timeout = \"2s\"\nhealth = \"/\"", "--flavor", "ollama", "--ttft", "0") +
		harness.DemoModel("generic", `idle_timeout = "2s"`, "--flavor", "generic", "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: models})
	names := []string{"llama", "llama-slots", "tgi", "ollama", "generic"}
	for _, name := range names {
		if code, body := chat(t, n, name); code != http.StatusOK {
			t.Fatalf("chat %s = %d %s", name, code, body)
		}
	}
	for _, name := range names {
		m := waitState(t, n, name, "sleeping", deadline)
		if !strings.Contains(m.Reason, "idle timeout") {
			t.Errorf("%s asleep for %q, want the idle timeout", name, m.Reason)
		}
	}
}

// evidence = "leases" keeps the old behaviour: unsupported, with the
// reason saying what is missing, and still serving.
func TestIdle_LeasesOnlyIsUnsupported(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("g",
		"idle_timeout = \"2s\"\nevidence = \"leases\"", "--flavor", "generic", "--ttft", "0")})
	if code, body := chat(t, n, "g"); code != http.StatusOK {
		t.Fatalf("chat = %d %s", code, body)
	}
	m := waitState(t, n, "g", "unsupported", deadline)
	if !strings.Contains(m.Reason, `evidence = "leases"`) || !strings.Contains(m.Reason, "allow_untracked_unload") {
		t.Errorf("reason %q, want what is missing", m.Reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("g", false, 2)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("an unsupported model must serve: %v %s", err, body)
	}
}

// Idle time counts from the last activity napd saw, by any evidence: a
// client that works on the engine's port directly, with requests too short
// for any one reading to catch running (only the engine's counters move),
// keeps the model awake while it works, and once it stops, the model
// sleeps an idle timeout later, not at once (as it did when idleness was
// counted from napd's own last request, long before).
func TestIdle_CountsFromOutsideUse(t *testing.T) {
	port := harness.FreePort(t)
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("l",
		fmt.Sprintf("port = %d\nidle_timeout = \"4s\"", port), "--flavor", "llamacpp", "--metrics", "--ttft", "0", "--tokens-per-second", "0")})
	if code, body := chat(t, n, "l"); code != http.StatusOK {
		t.Fatalf("chat = %d %s", code, body)
	}
	// The loop publishes the wake's end just after it grants the request.
	waitState(t, n, "l", "awake", deadline)
	direct := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", port)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // no connection stays to be seen
	var last time.Time
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		resp, err := client.Post(direct, "application/json", strings.NewReader(`{"model":"l","prompt":"x","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the engine answered the outside client %s", resp.Status)
		}
		last = time.Now()
		if m := n.ModelStatus("l"); m.State != "awake" {
			t.Fatalf("model %s (%s) while a client works on its port", m.State, m.Reason)
		}
	}
	waitState(t, n, "l", "sleeping", deadline)
	// The planner's rounds come every 2 s: the round after the last
	// request saw its counters move, so the sleep comes at least an idle
	// timeout after that round, which is after the request, less the
	// round's own few milliseconds.
	if after := time.Since(last); after < 3*time.Second {
		t.Errorf("asleep %s after the outside client's last request; want an idle timeout (4s) counted from it", after)
	}
}
