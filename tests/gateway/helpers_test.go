// Package gateway_test drives napd's gateway end to end: a real napd
// process in front of real napd-demo-engine processes, checked over HTTP,
// through napctl and against the engines' own counters.
package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// engine is a demo-engine model on a fixed port, so a test can read the
// engine's own counters.
type engine struct {
	name string
	port int
}

// demo returns the [models.NAME] TOML for a demo engine on a free port.
func demo(t *testing.T, name, extra string, flags ...string) (string, engine) {
	t.Helper()
	port := harness.FreePort(t)
	return harness.DemoModel(name, fmt.Sprintf("port = %d\n%s", port, extra), flags...), engine{name: name, port: port}
}

// stats are the demo engine's /debug/stats counters the tests read.
type stats struct {
	Completions       int `json:"completions"`
	StreamsCancelled  int `json:"streams_cancelled"`
	RequestsCancelled int `json:"requests_cancelled"`
	Running           int `json:"running"`
	// Priorities counts completions by their priority field ("none").
	Priorities map[string]int `json:"priorities"`
}

// stats reads the engine's counters; it fails the test when the engine
// does not answer.
func (e engine) stats(t *testing.T) stats {
	t.Helper()
	s, err := e.tryStats()
	if err != nil {
		t.Fatalf("engine %s stats: %v", e.name, err)
	}
	return s
}

func (e engine) tryStats() (stats, error) {
	var s stats
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/stats", e.port))
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status %d", resp.StatusCode)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// modelStatus reads one model's row from napd's control API.
func modelStatus(t *testing.T, n *harness.Napd, name string) control.ModelStatus {
	t.Helper()
	return n.ModelStatus(name)
}

// wake wakes a model with napctl and waits for it to serve.
func wake(t *testing.T, n *harness.Napd, name string) {
	t.Helper()
	if out, err := n.Napctl("wake", name); err != nil {
		t.Fatalf("napctl wake %s: %v\n%s", name, err, out)
	}
}

// eventually polls cond every 20 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// apiError is OpenAI's error shape.
type apiError struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Param   *string `json:"param"`
	} `json:"error"`
}

// wantError checks an error reply: its status, that it is JSON in OpenAI's
// error shape with the given code and the type that goes with the status,
// and that it carries X-Queue-Depth when a model was named. It returns the
// message.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, code string) string {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, body)
	}
	for _, k := range []string{"message", "type", "code", "param"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error body has no error.%s: %s", k, body)
		}
	}
	var e apiError
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	wantType := "invalid_request_error"
	if status >= 500 {
		wantType = "server_error"
	}
	if e.Error.Type != wantType || e.Error.Code != code || e.Error.Message == "" {
		t.Errorf("error = %+v, want type %q code %q and a message", *e.Error, wantType, code)
	}
	return e.Error.Message
}

// completion is the part of a chat completion the tests compare.
type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
}

// wantCompletion checks a 200 chat completion with napd's reply headers.
func wantCompletion(t *testing.T, resp *http.Response, body []byte) completion {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200; body %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Queue-Depth") == "" {
		t.Errorf("no X-Queue-Depth in %v", resp.Header)
	}
	var c completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("completion %s: %v", body, err)
	}
	if c.Object != "chat.completion" || len(c.Choices) != 1 || !strings.Contains(c.Choices[0].Message.Content, "tok") {
		t.Fatalf("completion = %s", body)
	}
	return c
}

// stream opens a streamed chat completion; the caller reads and closes
// the body.
func stream(t *testing.T, ctx context.Context, n *harness.Napd, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL("/v1/chat/completions"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream: status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp
}

// chatWith is a chat body whose user message is content.
func chatWith(model, content string, stream bool, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		model, stream, maxTokens, content)
}

// ctxFor is a context for one test's requests.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
