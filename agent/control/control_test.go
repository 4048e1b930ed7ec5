package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeController struct {
	mu      sync.Mutex
	slept   []string
	reset   []string
	reloads int
	events  chan Event
}

// Usage answers the window asked for, with one row.
func (f *fakeController) Usage(since time.Duration) Usage {
	return Usage{Since: time.Unix(0, 0).Add(since), Rows: []UsageRow{{Key: "alice", Model: "m", GPUHours: 1.5, Wakes: 2}}}
}

func (f *fakeController) Status() Status {
	return Status{Version: "test", Supervisor: "exec", Models: []ModelStatus{{Name: "m", State: "sleeping", Leases: 2}}}
}

func (f *fakeController) Wake(_ context.Context, model string, progress func(Progress)) error {
	switch model {
	case "m":
		half, left := 0.5, int64(3000)
		progress(Progress{Phase: "waking"})
		progress(Progress{Phase: "waking", Load: &LoadProgress{ReadBytes: 1 << 30, WeightBytes: 2 << 30, Progress: &half, LeftMs: &left}})
		progress(Progress{Phase: "verifying"})
		return nil
	case "broken":
		progress(Progress{Phase: "waking"})
		return errors.New("wake broken: health check failed: connection refused (3 of 3 attempts)")
	}
	return fmt.Errorf("%w: %q", ErrNotFound, model)
}

func (f *fakeController) Sleep(_ context.Context, model, strategy string) error {
	if model != "m" {
		return fmt.Errorf("%w: %q", ErrNotFound, model)
	}
	if strategy == "none" {
		return errors.New("sleep m: strategy none never sleeps")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slept = append(f.slept, model+"/"+strategy)
	return nil
}

func (f *fakeController) Reset(model string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reset = append(f.reset, model)
	return nil
}

func (f *fakeController) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloads++
	return nil
}

func (f *fakeController) Logs(model string, n int) ([]string, error) {
	if model != "m" {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, model)
	}
	lines := []string{"loading", "listening", "ready"}
	return lines[max(0, len(lines)-n):], nil
}

func (f *fakeController) Subscribe() (<-chan Event, func()) {
	return f.events, func() {}
}

func serve(t *testing.T, c Controller) *Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run", "control.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(c, nil)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return NewClient(path)
}

func TestListen_ModeAndStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	// A stale socket, as a crashed napd leaves it: bound, nobody listening.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	l, err := Listen(path)
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	defer l.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("mode = %v, want a socket with 0660", fi.Mode())
	}

	// A running napd's socket is an error, and keeps answering.
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "a running napd answers") {
		t.Errorf("Listen over a live socket: %v", err)
	}
	if c, err := net.Dial("unix", path); err != nil {
		t.Errorf("the live socket was removed: %v", err)
	} else {
		c.Close()
	}
}

func TestListen_KeepsWhatIsNotAStaleSocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "control.sock")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file: %v", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "precious" {
		t.Errorf("the regular file was touched: %q, %v", b, err)
	}
	if os.Geteuid() != 0 {
		return
	}
	// A directory another user owns is refused, with its owner and mode.
	foreign := filepath.Join(dir, "run")
	if err := os.Mkdir(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, 65534, -1); err != nil {
		t.Fatal(err)
	}
	_, err := Listen(filepath.Join(foreign, "control.sock"))
	if err == nil || !strings.Contains(err.Error(), foreign) || !strings.Contains(err.Error(), "owner uid 65534") {
		t.Errorf("Listen in a foreign-owned directory: %v", err)
	}
}

func TestClient_StatusSleepResetReload(t *testing.T) {
	f := &fakeController{}
	c := serve(t, f)
	ctx := context.Background()
	st, err := c.Status(ctx)
	if err != nil || len(st.Models) != 1 || st.Models[0].Leases != 2 {
		t.Fatalf("status = %+v, %v", st, err)
	}
	if err := c.Sleep(ctx, "m", "vllm-l2"); err != nil {
		t.Fatal(err)
	}
	if err := c.Sleep(ctx, "m", "none"); err == nil || !strings.Contains(err.Error(), "never sleeps") {
		t.Errorf("sleep none: %v", err)
	}
	if err := c.Sleep(ctx, "nope", ""); err == nil || !strings.Contains(err.Error(), "no such model") {
		t.Errorf("sleep unknown: %v", err)
	}
	if err := c.Reset(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if len(f.slept) != 1 || f.slept[0] != "m/vllm-l2" || len(f.reset) != 1 || f.reloads != 1 {
		t.Errorf("controller saw slept=%v reset=%v reloads=%d", f.slept, f.reset, f.reloads)
	}
}

func TestClient_WakeProgress(t *testing.T) {
	c := serve(t, &fakeController{})
	var phases []string
	var load *LoadProgress
	err := c.Wake(context.Background(), "m", func(p Progress) {
		phases = append(phases, p.Phase)
		if p.Load != nil {
			load = p.Load
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(phases, ",") != "waking,waking,verifying,awake" {
		t.Errorf("phases = %v", phases)
	}
	if load == nil || load.ReadBytes != 1<<30 || load.WeightBytes != 2<<30 || load.Progress == nil || *load.Progress != 0.5 ||
		load.LeftMs == nil || *load.LeftMs != 3000 {
		t.Errorf("load = %+v, want the half-way line through the wire", load)
	}
	err = c.Wake(context.Background(), "broken", nil)
	if err == nil || !strings.Contains(err.Error(), "3 of 3 attempts") {
		t.Errorf("broken wake: %v", err)
	}
	err = c.Wake(context.Background(), "ghost", nil)
	if err == nil || !strings.Contains(err.Error(), "no such model") {
		t.Errorf("unknown wake: %v", err)
	}
}

func TestClient_Events(t *testing.T) {
	f := &fakeController{events: make(chan Event, 2)}
	c := serve(t, f)
	f.events <- Event{Model: "m", Kind: "state", From: "sleeping", To: "waking", Reason: "request"}
	f.events <- Event{Model: "m", Kind: "wake", WakeMs: 412}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []Event
	err := c.Events(ctx, func(e Event) {
		got = append(got, e)
		if len(got) == 2 {
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].To != "waking" || got[1].WakeMs != 412 {
		t.Errorf("events = %+v", got)
	}
}

func TestClient_NoDaemon(t *testing.T) {
	c := NewClient(filepath.Join(t.TempDir(), "absent.sock"))
	_, err := c.Status(context.Background())
	if err == nil || !strings.Contains(err.Error(), "is napd running?") {
		t.Errorf("err = %v", err)
	}
}

func TestClient_Logs(t *testing.T) {
	c := serve(t, &fakeController{})
	lines, err := c.Logs(context.Background(), "m", 2)
	if err != nil || strings.Join(lines, ",") != "listening,ready" {
		t.Fatalf("logs = %v, %v", lines, err)
	}
	if _, err := c.Logs(context.Background(), "ghost", 2); err == nil || !strings.Contains(err.Error(), "no such model") {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := c.Logs(context.Background(), "m", 0); err == nil || !strings.Contains(err.Error(), "lines") {
		t.Errorf("0 lines: %v", err)
	}
}

// The admin handler serves status, wake, sleep, reset and events (as SSE)
// under /napd, and neither logs nor reload.
func TestAdminHandler_RoutesAndSSE(t *testing.T) {
	f := &fakeController{events: make(chan Event, 2)}
	srv := httptest.NewServer(AdminHandler(f, nil))
	defer srv.Close()
	get := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := get("GET", "/napd/v1/status"); resp.StatusCode != 200 || !strings.Contains(body, `"name":"m"`) {
		t.Errorf("status: %d %s", resp.StatusCode, body)
	}
	if resp, body := get("POST", "/napd/v1/models/m/wake"); resp.StatusCode != 200 || !strings.Contains(body, `"done":true`) {
		t.Errorf("wake: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get("POST", "/napd/v1/models/m/sleep?strategy=stop"); resp.StatusCode != 200 {
		t.Errorf("sleep: %d", resp.StatusCode)
	}
	if resp, _ := get("POST", "/napd/v1/models/m/reset"); resp.StatusCode != 200 {
		t.Errorf("reset: %d", resp.StatusCode)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/napd/v1/models/m/logs"}, {"POST", "/napd/v1/reload"}, {"GET", "/v1/status"},
	} {
		if resp, _ := get(c.method, c.path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", c.method, c.path, resp.StatusCode)
		}
	}
	if f.reloads != 0 || strings.Join(f.slept, ",") != "m/stop" || strings.Join(f.reset, ",") != "m" {
		t.Errorf("controller saw slept=%v reset=%v reloads=%d", f.slept, f.reset, f.reloads)
	}

	f.events <- Event{Model: "m", Kind: "state", From: "sleeping", To: "waking", Reason: "request"}
	f.events <- Event{Model: "m", Kind: "wake", WakeMs: 412}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/napd/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	r := bufio.NewReader(resp.Body)
	var lines []string
	for len(lines) < 6 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", lines, err)
		}
		lines = append(lines, strings.TrimSuffix(line, "\n"))
	}
	if lines[0] != "event: state" || !strings.HasPrefix(lines[1], "data: {") || lines[2] != "" ||
		lines[3] != "event: wake" || !strings.Contains(lines[4], `"wake_ms":412`) || lines[5] != "" {
		t.Errorf("SSE stream:\n%s", strings.Join(lines, "\n"))
	}
	var ev Event
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &ev); err != nil || ev.To != "waking" {
		t.Errorf("first event %+v, %v", ev, err)
	}
}

// GET /v1/usage: ?since= within what napd keeps, 24h by default; a bad
// window is a 400 that says what is wanted.
func TestUsage(t *testing.T) {
	c := serve(t, &fakeController{})
	ctx := context.Background()
	u, err := c.Usage(ctx, 3*time.Hour)
	if err != nil || !u.Since.Equal(time.Unix(0, 0).Add(3*time.Hour)) || len(u.Rows) != 1 || u.Rows[0].GPUHours != 1.5 {
		t.Fatalf("usage: %+v %v", u, err)
	}
	for _, bad := range []time.Duration{-time.Hour, 8 * 24 * time.Hour} {
		if _, err := c.Usage(ctx, bad); err == nil || !strings.Contains(err.Error(), "want a duration from 1s to 168h0m0s") {
			t.Errorf("since %s: %v", bad, err)
		}
	}
}
