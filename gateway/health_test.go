package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/napd/napd/agent/lease"
)

// TestGateway_ModelHealth: GET /health/models/NAME is 200 for a model that
// serves, 503 with Retry-After otherwise, the state in the body; it admits
// nothing and is no request of the model's.
func TestGateway_ModelHealth(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	for _, c := range []struct {
		method, name string
		status       int
		want         modelHealthBody
	}{
		{"GET", "m1", 200, modelHealthBody{Model: "m1", State: "awake", Serving: true, QueueDepth: 3}},
		{"GET", "a1", 200, modelHealthBody{Model: "m1", State: "awake", Serving: true, QueueDepth: 3}},
		{"GET", "m2", 503, modelHealthBody{Model: "m2", State: "failed", Reason: "exit status 1 after 3 attempts", QueueDepth: 3}},
		{"HEAD", "m2", 503, modelHealthBody{}},
	} {
		resp, b := e.do(c.method, "/health/models/"+c.name, "", nil)
		if resp.StatusCode != c.status {
			t.Fatalf("%s %s: status %d, want %d; %s", c.method, c.name, resp.StatusCode, c.status, b)
		}
		if ra := resp.Header.Get("Retry-After"); (c.status == 503) != (ra != "") {
			t.Errorf("%s %s: Retry-After %q with status %d", c.method, c.name, ra, c.status)
		}
		if resp.Header.Get(HeaderQueueDepth) != "3" {
			t.Errorf("%s %s: X-Queue-Depth %q", c.method, c.name, resp.Header.Get(HeaderQueueDepth))
		}
		if c.method == "HEAD" {
			continue
		}
		var got modelHealthBody
		if err := json.Unmarshal(b, &got); err != nil || got != c.want {
			t.Errorf("%s %s: body %s (%v), want %+v", c.method, c.name, b, err, c.want)
		}
	}
	resp, b := e.do("GET", "/health/models/nope", "", nil)
	wantError(t, resp, b, 404, "model_not_found")
	resp, b = e.do("POST", "/health/models/m1", "", nil)
	wantError(t, resp, b, 405, "method_not_allowed")

	if n := len(e.models.admitted()); n != 0 {
		t.Errorf("health checks admitted %d requests", n)
	}
	for _, o := range e.observations() {
		if o.model != "" {
			t.Errorf("health check observed as a request of %q", o.model)
		}
	}
	// A balancer checks every second: its 503s are not worth an info line.
	for _, line := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(line, "/health/models/m2") && !strings.Contains(line, `"level":"DEBUG"`) {
			t.Errorf("health check logged above debug: %s", line)
		}
	}
}

// TestGateway_ModelHealthNeedsAKey: with API keys on, model names and
// states are for the keys that may use them.
func TestGateway_ModelHealthNeedsAKey(t *testing.T) {
	keys, err := parseAPIKeys("keys", []byte("lb:sk-lb models=m1\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{APIKeys: keys})
	resp, b := e.do("GET", "/health/models/m1", "", nil)
	wantError(t, resp, b, 401, "invalid_api_key")
	auth := map[string]string{"Authorization": "Bearer sk-lb"}
	if resp, b = e.do("GET", "/health/models/m1", "", auth); resp.StatusCode != 200 {
		t.Errorf("with a key: %d %s", resp.StatusCode, b)
	}
	resp, b = e.do("GET", "/health/models/m2", "", auth)
	wantError(t, resp, b, 403, "model_not_allowed")
}

// TestGateway_RefusalWithoutRetryAfterGetsOne: every 503 carries
// Retry-After, so a balancer knows the refusal is napd's and retryable.
func TestGateway_RefusalWithoutRetryAfterGetsOne(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	e.models.admit = func(context.Context, lease.Request) (*Ticket, error) {
		return nil, &Refusal{Code: "queue_full", Message: "full"}
	}
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	wantError(t, resp, b, 503, "queue_full")
	if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1", ra)
	}
}

// refusingTransport is a RefusingTransport, as a ZMQ worker's is.
type refusingTransport struct{ http.RoundTripper }

func (refusingTransport) RefusesBeforeWork() {}

// TestGateway_EngineUnavailableIs502: napd never answers 503 for a request
// an engine may have started on; an engine's 503 goes out as 502 with
// X-Napd-Engine-Status, unless its transport refuses before any work.
func TestGateway_EngineUnavailableIs502(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"busy"}`))
	}, Options{})
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	if resp.StatusCode != 502 || resp.Header.Get(HeaderEngineStatus) != "503" || string(b) != `{"error":"busy"}` {
		t.Errorf("engine 503: got %d, %s %q, body %s; want 502 with the engine's body", resp.StatusCode,
			HeaderEngineStatus, resp.Header.Get(HeaderEngineStatus), b)
	}
	e.models.outcome()
	if obs := e.waitObservations(1); len(obs) != 1 || obs[0] != (observation{"m1", 502}) {
		t.Errorf("observed %+v, want m1 502", obs)
	}

	e.models.transport = refusingTransport{http.DefaultTransport}
	resp, _ = e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "7" || resp.Header.Get(HeaderEngineStatus) != "" {
		t.Errorf("refusing transport's 503: got %d, Retry-After %q, %s %q; want it unchanged", resp.StatusCode,
			resp.Header.Get("Retry-After"), HeaderEngineStatus, resp.Header.Get(HeaderEngineStatus))
	}
	e.models.outcome()
}
