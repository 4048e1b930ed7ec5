//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bin is the napd-demo-engine binary TestMain builds.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "napd-demo-engine-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "napd-demo-engine")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building napd-demo-engine: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// deadline bounds every wait on the real process.
const deadline = 10 * time.Second

// proc is a running napd-demo-engine.
type proc struct {
	cmd     *exec.Cmd
	url     string
	started time.Time
	exited  chan struct{}
	err     error // of Wait, valid once exited is closed
}

var listenLine = regexp.MustCompile(`msg=listening addr=(\S+)`)

// start runs the binary on a free loopback port and waits until it listens.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--port", "0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, started: time.Now(), exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	select {
	case a := <-addr:
		p.url = "http://" + a
	case <-p.exited:
		t.Fatalf("napd-demo-engine %v exited before listening: %v", args, p.err)
	case <-time.After(deadline):
		t.Fatalf("napd-demo-engine %v did not listen within %v", args, deadline)
	}
	return p
}

// wait returns the exit status, -1 for a death by signal.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(deadline):
		t.Fatalf("process still running after %v", deadline)
	}
	if ee, ok := errors.AsType[*exec.ExitError](p.err); ok {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("wait: %v", p.err)
	}
	return 0
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// get and post return the status and body; a transport error fails the test.
func (p *proc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return p.send(t, "GET", path, "")
}

func (p *proc) post(t *testing.T, path, body string) (int, string) {
	t.Helper()
	return p.send(t, "POST", path, body)
}

func (p *proc) send(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: deadline}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp.StatusCode, string(b)
}

// eventually polls cond every 20ms until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, deadline)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type stats struct {
	Completions      int   `json:"completions"`
	StreamsCancelled int   `json:"streams_cancelled"`
	Rejected         int   `json:"rejected"`
	IsSleeping       bool  `json:"is_sleeping"`
	LoadedBytes      int64 `json:"loaded_bytes"`
}

func (p *proc) stats(t *testing.T) stats {
	t.Helper()
	code, body := p.get(t, "/debug/stats")
	var s stats
	if code != 200 || json.Unmarshal([]byte(body), &s) != nil {
		t.Fatalf("/debug/stats: %d %s", code, body)
	}
	return s
}

func TestDemoEngine_StartupDelayAndModels(t *testing.T) {
	t.Parallel()
	p := start(t, "--startup-delay", "1s", "--model", "a", "--model", "b")
	if code, _ := p.get(t, "/health"); code != http.StatusServiceUnavailable {
		t.Fatalf("/health while loading = %d, want 503", code)
	}
	eventually(t, "/health turns 200", func() bool { code, _ := p.get(t, "/health"); return code == 200 })
	if took := time.Since(p.started); took < time.Second {
		t.Fatalf("healthy after %v, before the 1s startup delay", took)
	}
	code, body := p.get(t, "/v1/models")
	if code != 200 || !strings.Contains(body, `"id":"a"`) || !strings.Contains(body, `"id":"b"`) {
		t.Fatalf("/v1/models = %d %s", code, body)
	}
}

func TestDemoEngine_LoadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "w.safetensors"), make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--load-file", dir, "--load-rate", "4MiB")
	if code, _ := p.get(t, "/health"); code != http.StatusServiceUnavailable {
		t.Fatalf("/health while loading = %d, want 503", code)
	}
	eventually(t, "/health turns 200", func() bool { code, _ := p.get(t, "/health"); return code == 200 })
	// 3 MiB at 4 MiB/s: the pacing guarantees at least 0.75 s.
	if took := time.Since(p.started); took < 750*time.Millisecond {
		t.Fatalf("healthy after %v, faster than --load-rate allows", took)
	}
	if got := p.stats(t).LoadedBytes; got != 3<<20 {
		t.Fatalf("loaded_bytes = %d, want %d", got, 3<<20)
	}
}

func TestDemoEngine_FailStart(t *testing.T) {
	t.Parallel()
	p := start(t, "--fail-start", "--startup-delay", "300ms")
	if code, _ := p.get(t, "/health"); code != http.StatusServiceUnavailable {
		t.Fatalf("/health while loading = %d, want 503", code)
	}
	if code := p.wait(t); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	if took := time.Since(p.started); took < 300*time.Millisecond {
		t.Fatalf("exited after %v, before the startup delay", took)
	}
}

func TestDemoEngine_HangHealth(t *testing.T) {
	t.Parallel()
	p := start(t, "--hang-health")
	_, err := (&http.Client{Timeout: 300 * time.Millisecond}).Get(p.url + "/health")
	if err == nil || !strings.Contains(err.Error(), "Timeout") {
		t.Fatalf("/health answered (err %v), want a client timeout", err)
	}
	if code, _ := p.get(t, "/v1/models"); code != 200 {
		t.Fatalf("/v1/models = %d", code)
	}
}

func TestDemoEngine_CrashAfterMidStream(t *testing.T) {
	t.Parallel()
	p := start(t, "--crash-after", "2", "--ttft", "0", "--tokens-per-second", "0")
	if code, _ := p.post(t, "/v1/completions", `{"prompt":"x"}`); code != 200 {
		t.Fatalf("first completion = %d", code)
	}
	resp, err := http.Post(p.url+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"content":"x"}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "tok1") || strings.Contains(string(body), "[DONE]") {
		t.Fatalf("crashing stream = %q, want a few chunks and no [DONE]", body)
	}
	if code := p.wait(t); code != 3 {
		t.Fatalf("exit status %d, want 3", code)
	}
}

func TestDemoEngine_SIGTERMEndsStreamsAndExits(t *testing.T) {
	t.Parallel()
	p := start(t, "--ttft", "0", "--tokens-per-second", "10")
	resp, err := http.Post(p.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":10000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("reading the first chunk: %v", err)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit status after SIGTERM %d, want 0", code)
	}
}

func TestDemoEngine_IgnoreSIGTERM(t *testing.T) {
	t.Parallel()
	p := start(t, "--ignore-sigterm")
	p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	if !p.alive() {
		t.Fatal("exited on SIGTERM despite --ignore-sigterm")
	}
	if code, _ := p.get(t, "/health"); code != 200 {
		t.Fatalf("/health after SIGTERM = %d", code)
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	if code := p.wait(t); code != -1 {
		t.Fatalf("exit status %d, want death by SIGKILL", code)
	}
}

// rss reads VmRSS of pid in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/PID/status")
	return 0
}

func TestDemoEngine_MemoryFollowsSleepLevel(t *testing.T) {
	t.Parallel()
	const size = 96 << 20
	p := start(t, "--memory", "96MiB", "--sleep-mode")
	pid := p.cmd.Process.Pid
	if got := rss(t, pid); got < size {
		t.Fatalf("VmRSS %d MiB, want at least the 96MiB of weights", got>>20)
	}
	if code, body := p.post(t, "/sleep?level=1", ""); code != 200 {
		t.Fatalf("sleep level 1 = %d %s", code, body)
	}
	if got := rss(t, pid); got < size {
		t.Fatalf("VmRSS %d MiB after a level-1 sleep, want the weights kept", got>>20)
	}
	p.post(t, "/wake_up", "")
	if code, body := p.post(t, "/sleep?level=2", ""); code != 200 {
		t.Fatalf("sleep level 2 = %d %s", code, body)
	}
	eventually(t, "VmRSS drops after a level-2 sleep", func() bool { return rss(t, pid) < size/2 })
	p.post(t, "/wake_up", "")
	if got := rss(t, pid); got < size {
		t.Fatalf("VmRSS %d MiB after the wake, want the weights back", got>>20)
	}
}

func TestDemoEngine_TimingAndSleepOverHTTP(t *testing.T) {
	t.Parallel()
	p := start(t, "--ttft", "100ms", "--tokens-per-second", "20", "--sleep-mode", "--wake-delay", "200ms")
	begin := time.Now()
	code, body := p.post(t, "/v1/completions", `{"prompt":"x","max_tokens":5,"stream":true}`)
	if took := time.Since(begin); took < 300*time.Millisecond {
		t.Fatalf("5 tokens streamed in %v, want at least 100ms TTFT + 4 x 50ms", took)
	}
	if code != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream = %d %q", code, body)
	}

	if code, _ := p.post(t, "/sleep", `{"level":2}`); code != 200 {
		t.Fatalf("sleep = %d", code)
	}
	if _, body := p.get(t, "/is_sleeping"); body != `{"is_sleeping":true}` {
		t.Fatalf("/is_sleeping = %s", body)
	}
	if _, body := p.get(t, "/metrics"); !strings.Contains(body, `vllm:engine_sleep_state{engine="0",model_name="demo",sleep_state="weights_offloaded"} 1`) {
		t.Fatalf("metrics while asleep:\n%s", body)
	}
	if code, body := p.post(t, "/v1/completions", `{"prompt":"x"}`); code != 503 || !strings.Contains(body, `"error"`) {
		t.Fatalf("completion while asleep = %d %s", code, body)
	}
	begin = time.Now()
	if code, _ := p.post(t, "/wake_up?tags=weights&tags=kv_cache", ""); code != 200 {
		t.Fatalf("wake_up = %d", code)
	}
	if took := time.Since(begin); took < 200*time.Millisecond {
		t.Fatalf("wake took %v, want the 200ms wake delay", took)
	}
	if code, _ := p.post(t, "/v1/completions", `{"prompt":"x","max_tokens":1}`); code != 200 {
		t.Fatalf("completion after wake = %d", code)
	}
	_, body = p.get(t, "/debug/requests")
	want := `[{"method":"POST","path":"/sleep","query":"","body":"{\"level\":2}"},{"method":"GET","path":"/is_sleeping","query":""},{"method":"POST","path":"/wake_up","query":"tags=weights\u0026tags=kv_cache"}]`
	if body != want {
		t.Fatalf("/debug/requests = %s\nwant %s", body, want)
	}
	if s := p.stats(t); s.Completions != 2 || s.Rejected != 1 || s.IsSleeping {
		t.Fatalf("stats = %+v", s)
	}
}

func TestDemoEngine_ClientDisconnectIsCounted(t *testing.T) {
	t.Parallel()
	p := start(t, "--ttft", "0", "--tokens-per-second", "20")
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "POST", p.url+"/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":10000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for range 2 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	eventually(t, "the cancelled stream is counted", func() bool { return p.stats(t).StreamsCancelled == 1 })
	if code, body := p.get(t, "/metrics"); code != 200 || !strings.Contains(body, `vllm:num_requests_running{engine="0",model_name="demo"} 0`) {
		t.Fatalf("metrics after the disconnect:\n%s", body)
	}
}

func TestDemoEngine_BadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--memory", "lots"}, {"--memory", "2GB"}, {"--no-such-flag"}, {"extra"},
		{"--sleep-idle-seconds", "0"}, {"--sleep-idle-seconds", "-2"}, {"--sleep-idle-seconds", "5m"},
		{"--load-file", "/nonexistent/w.gguf"}, {"--load-file", "/dev/null"}, {"--load-rate", "fast"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		ee, ok := errors.AsType[*exec.ExitError](err)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("%v: err %v, want exit status 2; output %s", args, err, out)
		}
	}
}

func TestDemoEngine_TGIListensOnceLoaded(t *testing.T) {
	t.Parallel()
	p := start(t, "--flavor", "tgi", "--startup-delay", "300ms")
	if took := time.Since(p.started); took < 300*time.Millisecond {
		t.Fatalf("listening after %v, before the startup delay", took)
	}
	if code, _ := p.get(t, "/health"); code != http.StatusOK {
		t.Fatalf("/health = %d, want 200 as soon as it listens", code)
	}
	if code, body := p.get(t, "/metrics"); code != 200 || !strings.Contains(body, "tgi_batch_current_size 0") {
		t.Fatalf("/metrics = %d %s", code, body)
	}
}

func TestDemoEngine_UnknownFlavor(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(bin, "--flavor", "triton").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), `unknown --flavor "triton"`) {
		t.Fatalf("err %v, output %s; want exit status 2 naming the flavor", err, out)
	}
}
