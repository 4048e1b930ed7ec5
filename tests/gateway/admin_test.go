package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// admin sends a request to napd's admin API with an optional key.
func admin(t *testing.T, ctx context.Context, n *harness.Napd, method, path, key string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, n.URL(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp, b
}

// The admin API on the gateway: an admin key may read the status, wake,
// sleep and follow the events as SSE; an inference key gets 403, no key
// 401; the engine logs and reload are not served there.
func TestAdmin_APIByRole(t *testing.T) {
	t.Parallel()
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("ops:sk-ops-0123456789 role=admin\nalice:sk-alice-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, _ := demo(t, "m", `sleep = "stop"`, "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m, Gateway: "api_keys_file = " + strconv.Quote(keys)})
	ctx := ctxFor(t, 60*time.Second)
	const ops, alice = "sk-ops-0123456789", "sk-alice-0123456789"

	resp, body := admin(t, ctx, n, "GET", "/napd/v1/status", alice)
	wantError(t, resp, body, http.StatusForbidden, "admin_only")
	resp, body = admin(t, ctx, n, "POST", "/napd/v1/models/m/wake", alice)
	wantError(t, resp, body, http.StatusForbidden, "admin_only")
	resp, body = admin(t, ctx, n, "GET", "/napd/v1/status", "")
	wantError(t, resp, body, http.StatusUnauthorized, "invalid_api_key")

	resp, body = admin(t, ctx, n, "GET", "/napd/v1/status", ops)
	var st control.Status
	if resp.StatusCode != 200 || json.Unmarshal(body, &st) != nil || len(st.Models) != 1 || st.Models[0].State != "sleeping" {
		t.Fatalf("status: %d %s", resp.StatusCode, body)
	}

	// Follow the events while an admin wakes and then sleeps the model.
	events, err := http.NewRequestWithContext(ctx, "GET", n.URL("/napd/v1/events"), nil)
	if err != nil {
		t.Fatal(err)
	}
	events.Header.Set("Authorization", "Bearer "+ops)
	er, err := http.DefaultClient.Do(events)
	if err != nil || er.StatusCode != 200 || er.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %v %v", er, err)
	}
	defer er.Body.Close()

	resp, body = admin(t, ctx, n, "POST", "/napd/v1/models/m/wake", ops)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"phase":"awake","elapsed_ms"`) || !strings.Contains(string(body), `"done":true`) {
		t.Fatalf("wake: %d %s", resp.StatusCode, body)
	}
	resp, body = admin(t, ctx, n, "POST", "/napd/v1/models/m/sleep", ops)
	if resp.StatusCode != 200 {
		t.Fatalf("sleep: %d %s", resp.StatusCode, body)
	}
	// The SSE stream carries the model's way to awake and back to sleep.
	r := bufio.NewReader(er.Body)
	var seen []string
	for !contains(seen, "sleeping") {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("events after %v: %v", seen, err)
		}
		data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok {
			continue
		}
		var ev control.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if ev.Kind == control.EventState {
			seen = append(seen, ev.To)
		}
	}
	if !contains(seen, "awake") {
		t.Errorf("state events %v, want awake then sleeping", seen)
	}

	for _, c := range []struct{ method, path string }{{"GET", "/napd/v1/models/m/logs"}, {"POST", "/napd/v1/reload"}} {
		if resp, _ := admin(t, ctx, n, c.method, c.path, ops); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", c.method, c.path, resp.StatusCode)
		}
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// The status page rendered by a real headless Chromium: every model with
// its state, the page self-contained; a screenshot is written to
// $NAPD_TEST_ARTIFACTS (or the test's temp dir).
func TestStatusPage_InChromium(t *testing.T) {
	t.Parallel()
	browser, lookErr := exec.LookPath("chromium")
	if lookErr != nil {
		t.Skip("chromium is not installed (scripts/test-deps.sh installs it)")
	}
	// The fake nvidia-smi counts only the engines of the napd that runs
	// it (its children), so tests running beside this one with a model of
	// the same name do not add to its GPU.
	const llama = "llama"
	m1, _ := demo(t, llama, `sleep = "stop"`+"\naliases = [\"fast\"]", "--ttft", "0")
	m2, _ := demo(t, "qwen", `sleep = "stop"`, "--ttft", "0")
	// The planner test's fake nvidia-smi: one 80 GiB GPU on which llama's
	// engine holds 20 GiB.
	state := filepath.Join(t.TempDir(), "gpu-state")
	if err := os.WriteFile(state, []byte("total 81920\nmodel "+llama+" 20480\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	smi, err := filepath.Abs(filepath.Join("..", "planner", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	n := harness.Start(t, harness.Options{Models: m1 + m2, Env: []string{
		"PATH=" + smi + ":" + os.Getenv("PATH"), "FAKE_SMI_STATE=" + state}})
	// Without keys the admin API answers loopback clients.
	if resp, body := admin(t, ctxFor(t, time.Minute), n, "POST", "/napd/v1/models/"+llama+"/wake", ""); resp.StatusCode != 200 || !strings.Contains(string(body), `"done":true`) {
		t.Fatalf("wake: %d %s", resp.StatusCode, body)
	}
	fakeGPU := n.GPUSource(10*time.Second) == "nvidia-smi"
	if fakeGPU {
		// The planner measures every 2 s.
		eventually(t, 30*time.Second, "llama's GPU memory measured", func() bool {
			return modelStatus(t, n, llama).GPUBytes["0"] > 0
		})
	}

	dir := os.Getenv("NAPD_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "status-page.png")
	profile := t.TempDir()
	run := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
			"--no-first-run", "--user-data-dir=" + profile, "--window-size=1280,900"}
		cmd := exec.CommandContext(ctx, browser, append(base, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return out
	}
	dom := string(run("--dump-dom", n.URL("/napd/")))
	rows := regexp.MustCompile(`data-model="([^"]+)" data-state="([^"]+)"`).FindAllStringSubmatch(dom, -1)
	got := map[string]string{}
	for _, r := range rows {
		got[r[1]] = r[2]
	}
	if got[llama] != "awake" || got["qwen"] != "sleeping" || len(got) != 2 {
		t.Errorf("models and states in the rendered page: %v\n%s", got, dom)
	}
	for _, want := range []string{"aliases: fast", `class="state s-awake"`, "<h2>GPUs</h2>", "napd"} {
		if !strings.Contains(dom, want) {
			t.Errorf("rendered page lacks %q", want)
		}
	}
	if fakeGPU {
		// Other tests' engines on this host may hold memory on the fake GPU
		// too: they are "other processes".
		for _, want := range []string{"GPU 0 · Fake GPU", "used of 80.0 GiB", `style="width:25.00%" title="` + llama + `: 20.0 GiB"`, "GPU 0: 20.0 GiB"} {
			if !strings.Contains(dom, want) {
				t.Errorf("rendered page lacks the GPU bar's %q", want)
			}
		}
	}

	run("--screenshot="+shot, "--hide-scrollbars", n.URL("/napd/"))
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Errorf("screenshot %s: %d bytes, not a PNG of a rendered page", shot, len(png))
	}
	t.Logf("screenshot: %s", shot)
}
