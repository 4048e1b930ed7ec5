package gateway_test

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// 200, 400, 404 and 413 on one napd: only the good request reaches the
// engine; the refused ones (413 included) never do.
func TestStatus_ClientErrorsNeverReachTheEngine(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", `sleep = "stop"`, "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m, Gateway: `max_body = "1KiB"`})
	ctx := ctxFor(t, 30*time.Second)
	wake(t, n, "m")

	big := chatWith("m", strings.Repeat("word ", 400), false, 4) // 2 KiB > max_body
	cases := []struct {
		name, body string
		header     []string
		status     int
		code       string
		model      bool // the reply names a model, so it carries X-Queue-Depth
	}{
		{"bad JSON", `{"model":"m",`, nil, http.StatusBadRequest, "invalid_json", false},
		{"not an object", `["m"]`, nil, http.StatusBadRequest, "invalid_json", false},
		{"no model", `{"messages":[]}`, nil, http.StatusBadRequest, "missing_model", false},
		{"unknown model", harness.Chat("nope", false, 4), nil, http.StatusNotFound, "model_not_found", false},
		{"bad X-Request-Timeout", harness.Chat("m", false, 4), []string{"X-Request-Timeout", "soon"}, http.StatusBadRequest, "invalid_request_timeout", false},
		{"body over max_body", big, nil, http.StatusRequestEntityTooLarge, "request_too_large", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body, err := n.Post(ctx, "/v1/chat/completions", c.body, c.header...)
			if err != nil {
				t.Fatal(err)
			}
			msg := wantError(t, resp, body, c.status, c.code)
			if strings.Contains(msg, "word word") {
				t.Errorf("error message echoes the body: %q", msg)
			}
		})
	}
	if s := eng.stats(t); s.Completions != 0 {
		t.Fatalf("engine saw %d completions from refused requests, want 0", s.Completions)
	}

	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4))
	if err != nil {
		t.Fatal(err)
	}
	wantCompletion(t, resp, body)
	if resp.Header.Get("X-Napd-Wake-Ms") != "" {
		t.Errorf("a request to an awake model says it waited for a wake: %v", resp.Header)
	}
	if s := eng.stats(t); s.Completions != 1 {
		t.Fatalf("engine completions = %d, want 1", s.Completions)
	}
}

// With api_keys_file, a missing or wrong key is 401 and never reaches the
// engine; a right key works and its name labels the request. No key ever
// appears in napd's output.
func TestStatus_APIKeys(t *testing.T) {
	t.Parallel()
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("# clients\nalice:sk-alice-0123456789\nbob:sk-bob-9876543210\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, eng := demo(t, "m", `sleep = "stop"`, "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m, Gateway: "api_keys_file = " + strconv.Quote(keys)})
	ctx := ctxFor(t, 30*time.Second)
	wake(t, n, "m")

	for _, c := range []struct {
		name   string
		header []string
	}{
		{"missing", nil},
		{"wrong", []string{"Authorization", "Bearer sk-mallory-0000000000"}},
		{"not bearer", []string{"Authorization", "Basic sk-alice-0123456789"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4), c.header...)
			if err != nil {
				t.Fatal(err)
			}
			wantError(t, resp, body, http.StatusUnauthorized, "invalid_api_key")
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("401 without WWW-Authenticate: %v", resp.Header)
			}
		})
	}
	if s := eng.stats(t); s.Completions != 0 {
		t.Fatalf("engine saw %d completions from unauthenticated requests", s.Completions)
	}

	// /health stays open: it is napd's liveness, not the API.
	resp, err := http.Get(n.URL("/health"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/health with keys on: %d", resp.StatusCode)
	}

	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4), "Authorization", "Bearer sk-bob-9876543210")
	if err != nil {
		t.Fatal(err)
	}
	wantCompletion(t, resp, body)
	// The request line is logged at debug level with the key's name as
	// the client label.
	n.WaitLog(`client=bob`, 5*time.Second)
	for _, secret := range []string{"sk-alice-0123456789", "sk-bob-9876543210", "sk-mallory-0000000000"} {
		if strings.Contains(n.Log(), secret) {
			t.Errorf("napd's output contains the key %q", secret)
		}
	}
}

// An engine that dies while a request waits for its answer: 502 in the
// OpenAI shape, with the model's headers.
func TestStatus_BadGateway(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", `sleep = "stop"`, "--ttft", "10s")
	n := harness.Start(t, harness.Options{Models: m})
	ctx := ctxFor(t, 30*time.Second)
	wake(t, n, "m")
	pid := enginePID(t, n, "m")

	var wg sync.WaitGroup
	wg.Add(1)
	var resp *http.Response
	var body []byte
	var err error
	go func() {
		defer wg.Done()
		resp, body, err = n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4))
	}()
	eventually(t, 10*time.Second, "request running in the engine", func() bool { return eng.stats(t).Running == 1 })
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill engine %d: %v", pid, err)
	}
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	msg := wantError(t, resp, body, http.StatusBadGateway, "engine_unreachable")
	if !strings.Contains(msg, "m") || resp.Header.Get("X-Queue-Depth") == "" {
		t.Errorf("502 message %q, headers %v", msg, resp.Header)
	}
}

var pidRE = regexp.MustCompile(`msg="engine started"[^\n]* model=(\S+) pid=(\d+)`)

// enginePID is the pid of the model's last started engine, from napd's log.
func enginePID(t *testing.T, n *harness.Napd, model string) int {
	t.Helper()
	pid := 0
	for _, m := range pidRE.FindAllStringSubmatch(n.Log(), -1) {
		if m[1] == model {
			pid, _ = strconv.Atoi(m[2])
		}
	}
	if pid == 0 {
		t.Fatalf("no engine started for %s in napd's log", model)
	}
	return pid
}

// engineStarts counts the engines napd started for model.
func engineStarts(n *harness.Napd, model string) int {
	c := 0
	for _, m := range pidRE.FindAllStringSubmatch(n.Log(), -1) {
		if m[1] == model {
			c++
		}
	}
	return c
}
