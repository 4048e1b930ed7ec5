//go:build linux

// Package fleet tests napd behind a real HAProxy started from the example
// configuration the package ships (docs/examples/haproxy.cfg): two napd
// "hosts" on two loopback addresses, the same ports on each, with demo
// engines.
package fleet

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// within bounds every wait on observable state: generous, for a busy
// machine; nothing waits for it unless something is wrong.
const within = 60 * time.Second

// host is one napd of the fleet.
type host struct {
	name  string // its server name in haproxy.cfg
	ip    string
	napd  *harness.Napd
	agent string // its haproxy_agent_listen address
}

// fleet is two hosts and the HAProxy in front of them.
type fleet struct {
	hosts  []*host
	front  string // HAProxy's frontend address
	stats  string // HAProxy's stats page address
	log    string // HAProxy's log file
	client *http.Client
}

// Each host runs qwen (alias Qwen/Qwen3-8B) and llama. qwen never starts on
// host1 (it fails there once something wakes it); on host2 it loads for
// three seconds, long enough to see it waking, and streams slowly enough to
// hold a drain open.
func hostModels(name string) string {
	qwenFlags := []string{"--model", "Qwen/Qwen3-8B"}
	if name == "host1" {
		qwenFlags = append(qwenFlags, "--fail-start")
	} else {
		qwenFlags = append(qwenFlags, "--startup-delay", "3s", "--tokens-per-second", "20")
	}
	return harness.DemoModel("qwen", `aliases = ["Qwen/Qwen3-8B"]`, qwenFlags...) +
		harness.DemoModel("llama", "", "--tokens-per-second", "20")
}

const policy = `idle_timeout = "1h"
drain_timeout = "2m"
wake_timeout = "30s"
wake_attempts = 2
allow_untracked_unload = false
`

func startFleet(t *testing.T) *fleet {
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("haproxy not installed: run `make test-deps`")
	}
	gwPort, agentPort := harness.FreePort(t), harness.FreePort(t)
	f := &fleet{
		front:  fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		stats:  fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		client: &http.Client{Transport: &http.Transport{}},
	}
	t.Cleanup(f.client.CloseIdleConnections)
	for i, name := range []string{"host1", "host2"} {
		ip := fmt.Sprintf("127.0.0.%d", i+2)
		h := &host{name: name, ip: ip, agent: fmt.Sprintf("%s:%d", ip, agentPort)}
		h.napd = harness.Start(t, harness.Options{
			Listen: fmt.Sprintf("%s:%d", ip, gwPort),
			Agent:  fmt.Sprintf("haproxy_agent_listen = %q", h.agent),
			Policy: policy,
			Models: hostModels(name),
		})
		f.hosts = append(f.hosts, h)
	}

	// The shipped example, with this fleet's addresses.
	example, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "docs", "examples", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(example)
	for _, r := range [][2]string{
		{"10.0.0.1", f.hosts[0].ip},
		{"10.0.0.2", f.hosts[1].ip},
		{":8080", fmt.Sprintf(":%d", gwPort)},
		{"agent-port 8081", fmt.Sprintf("agent-port %d", agentPort)},
		{"bind :8000", "bind " + f.front},
		{"bind 127.0.0.1:8404", "bind " + f.stats},
		{"log /dev/log local0", "log stderr format raw local0"},
	} {
		if !strings.Contains(cfg, r[0]) {
			t.Fatalf("docs/examples/haproxy.cfg has no %q to replace: update this test with the example", r[0])
		}
		cfg = strings.ReplaceAll(cfg, r[0], r[1])
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "haproxy.log")
	f.log = logPath
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close() // haproxy has its own descriptor
	cmd := exec.Command(haproxy, "-db", "-f", path)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("haproxy log:\n%s", b)
		}
	})
	// Every model asleep everywhere: no host serves it, each may wake it.
	for _, be := range []string{"napd_qwen", "napd_llama"} {
		for _, h := range f.hosts {
			f.waitServer(t, be, h.name, "UP", 0)
			f.waitServer(t, be, h.name+"-wake", "UP", 1)
		}
	}
	return f
}

// TestFleet walks one fleet through the cases in order: each leaves the
// models where the next expects them.
func TestFleet(t *testing.T) {
	f := startFleet(t)
	host1, host2 := f.hosts[0], f.hosts[1]

	t.Run("AgentAnswersWhileAsleep", func(t *testing.T) {
		for line, want := range map[string]string{
			"qwen\n":          "up ready 1% #sleeping, 0 queued\n",
			"Qwen/Qwen3-8B\n": "up ready 1% #sleeping, 0 queued\n",
			"qwen awake\n":    "up ready 0% #sleeping, 0 queued\n",
			"nope\n":          "down #no model nope\n",
			"qwen later\n":    "down #napd: unknown mode \"later\": want MODEL or MODEL awake\n",
		} {
			if got := harness.AskAgent(t, host1.agent, line); got != want {
				t.Errorf("agent answer to %q = %q, want %q", line, got, want)
			}
		}
	})

	t.Run("AwakeOnHost2GetsTheRequests", func(t *testing.T) {
		woken := napctl(host2, "wake", "qwen")
		if got := waitAgent(t, host2.agent, "qwen awake\n", "up ready 100% #waking"); !strings.HasSuffix(got, " queued\n") {
			t.Errorf("waking: %q", got)
		}
		if err := <-woken; err != nil {
			t.Fatalf("napctl wake qwen on host2: %v", err)
		}
		if got := harness.AskAgent(t, host2.agent, "qwen awake\n"); got != "up ready 100% #awake, 0 queued\n" {
			t.Errorf("awake: %q", got)
		}
		f.waitServer(t, "napd_qwen", "host2", "UP", 100)
		for range 10 {
			f.wantServedBy(t, "Qwen/Qwen3-8B", "host2")
		}
		// host1 never saw one: its qwen, which cannot start, still sleeps.
		wantState(t, host1, "qwen", "sleeping")
	})

	t.Run("AmbiguousRequestsReadAlike", func(t *testing.T) { f.ambiguousRequests(t, host2) })

	t.Run("AsleepEverywhereWakesOnOneHost", func(t *testing.T) {
		// No host has llama awake: the first host that can wake it does.
		f.wantServedBy(t, "llama", "host1-wake")
		f.waitServer(t, "napd_llama", "host1", "UP", 100)
		for range 10 {
			f.wantServedBy(t, "llama", "host1")
		}
		wantState(t, host1, "llama", "awake")
		wantState(t, host2, "llama", "sleeping")
	})

	t.Run("DrainingAnswersDrain", func(t *testing.T) {
		// A long request holds qwen on host2 while an operator puts it to
		// sleep; the test ends it once it has seen the drain.
		ctx, endRequest := context.WithCancel(context.Background())
		defer endRequest()
		go func() { _, _, _ = host2.napd.Post(ctx, "/v1/chat/completions", harness.Chat("qwen", false, 5000)) }()
		host2.napd.WaitLeases("qwen", 1, within)
		slept := napctl(host2, "sleep", "qwen")
		waitAgent(t, host2.agent, "qwen\n", "up drain #draining, 0 queued\n")
		endRequest()
		if err := <-slept; err != nil {
			t.Fatalf("napctl sleep qwen on host2: %v", err)
		}
		waitAgent(t, host2.agent, "qwen\n", "up ready 1% #sleeping, 0 queued\n")
	})

	t.Run("FailedOnHost1IsAvoided", func(t *testing.T) {
		if out, err := host1.napd.Napctl("wake", "qwen"); err == nil {
			t.Fatalf("napctl wake qwen on host1 succeeded, want a failure: %s", out)
		}
		wantState(t, host1, "qwen", "failed")
		if got := harness.AskAgent(t, host1.agent, "qwen\n"); got != "down #failed, 0 queued\n" {
			t.Errorf("failed: %q", got)
		}
		// HAProxy may have seen the failing wake as waking (weight 100):
		// wait until it has seen the failure on both of host1's servers.
		f.waitServer(t, "napd_qwen", "host1", "DOWN (agent)", -1)
		f.waitServer(t, "napd_qwen", "host1-wake", "DOWN (agent)", -1)
		f.waitServer(t, "napd_qwen", "host2", "UP", 0)
		// host2's wake server was draining in the test before: HAProxy must
		// have seen it ready again (its agent check runs on its own
		// interval, late on a busy machine).
		f.waitServer(t, "napd_qwen", "host2-wake", "UP", -1)
		// qwen is awake nowhere; host1 comes first but failed: host2 wakes it.
		f.wantServedBy(t, "qwen", "host2-wake")
		f.waitServer(t, "napd_qwen", "host2", "UP", 100)
		f.wantServedBy(t, "qwen", "host2")
	})

	t.Run("StoppedHostIsAvoided", func(t *testing.T) {
		// llama is awake on host1 only. host1 stops under load: no
		// request fails, host2 wakes llama and serves the rest.
		var (
			mu       sync.Mutex
			failures []string
			byServer = map[string]int{}
		)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var stopOnce sync.Once
		halt := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
		defer halt()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					served, status, body, err := f.post("llama")
					mu.Lock()
					if err != nil || status != 200 {
						failures = append(failures, fmt.Sprintf("%d %v %s", status, err, body))
					} else {
						byServer[served]++
					}
					mu.Unlock()
				}
			}()
		}
		servedBy := func(name string) int {
			mu.Lock()
			defer mu.Unlock()
			return byServer[name]
		}
		counts := func() string {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Sprintf("served by %v, %d failed", byServer, len(failures))
		}
		waitFor(t, func() string { return "requests served by host1 before it stops: " + counts() },
			func() bool { return servedBy("host1") >= 4 })
		host1.napd.Stop()
		// It told HAProxy to drain before its gateway stopped listening.
		if !strings.Contains(host1.napd.Log(), "balancers told to drain") {
			t.Errorf("host1 stopped without HAProxy asking again and being told to drain:\n%s", host1.napd.Log())
		}
		waitFor(t, func() string { return "requests served by host2 after host1 stopped: " + counts() },
			func() bool { return servedBy("host2") >= 8 })
		halt()
		if len(failures) > 0 {
			t.Errorf("%d requests failed while host1 stopped:\n%s", len(failures), strings.Join(failures, "\n"))
		}
		t.Log(counts())
		wantState(t, host2, "llama", "awake")
	})
}

// napctl runs napctl against h in the background and reports how it ended.
func napctl(h *host, args ...string) <-chan error {
	done := make(chan error, 1)
	go func() {
		out, err := h.napd.Napctl(args...)
		if err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
		done <- err
	}()
	return done
}

// post sends a small chat completion for model through HAProxy.
func (f *fleet) post(model string) (servedBy string, status int, body []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.front+"/v1/chat/completions",
		strings.NewReader(harness.Chat(model, false, 2)))
	if err != nil {
		return "", 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return "", 0, nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	return resp.Header.Get("X-Served-By"), resp.StatusCode, body, err
}

// wantServedBy sends one request for model and wants a 200 from server.
func (f *fleet) wantServedBy(t *testing.T, model, server string) {
	t.Helper()
	served, status, body, err := f.post(model)
	if err != nil || status != 200 || served != server {
		t.Fatalf("request for %s: %d from %q (%v) %s; want 200 from %s\nqwen: %s\nllama: %s", model, status, served, err, body, server,
			f.statsLine("napd_qwen"), f.statsLine("napd_llama"))
	}
}

// serverStat is one server's row of HAProxy's stats CSV.
type serverStat struct {
	status string
	weight int
	agent  string // the agent's last answer
}

// servers reads HAProxy's stats page: backend → server → row.
func (f *fleet) servers() (map[string]map[string]serverStat, error) {
	resp, err := f.client.Get("http://" + f.stats + "/;csv")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(b, []byte("# "))))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("stats CSV: %v: %q", err, b)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	out := map[string]map[string]serverStat{}
	for _, row := range rows[1:] {
		get := func(name string) string {
			if i, ok := col[name]; ok && i < len(row) {
				return row[i]
			}
			return ""
		}
		be := get("pxname")
		if out[be] == nil {
			out[be] = map[string]serverStat{}
		}
		w, _ := strconv.Atoi(get("weight"))
		out[be][get("svname")] = serverStat{status: get("status"), weight: w, agent: get("last_agt")}
	}
	return out, nil
}

// waitServer waits until HAProxy shows backend/server in status with
// weight (-1: any weight).
func (f *fleet) waitServer(t *testing.T, backend, server, status string, weight int) {
	t.Helper()
	waitFor(t, func() string {
		return fmt.Sprintf("haproxy %s/%s %s weight %d (now: %s)", backend, server, status, weight, f.statsLine(backend))
	}, func() bool {
		all, err := f.servers()
		if err != nil {
			return false
		}
		s, ok := all[backend][server]
		return ok && s.status == status && (weight < 0 || s.weight == weight)
	})
}

// statsLine describes a backend's servers for failure messages.
func (f *fleet) statsLine(backend string) string {
	all, err := f.servers()
	if err != nil {
		return err.Error()
	}
	var parts []string
	for name, s := range all[backend] {
		parts = append(parts, fmt.Sprintf("%s %s w%d %q", name, s.status, s.weight, s.agent))
	}
	return strings.Join(parts, "; ")
}

// waitAgent asks until the answer to line starts with prefix.
func waitAgent(t *testing.T, addr, line, prefix string) string {
	t.Helper()
	var got string
	waitFor(t, func() string { return fmt.Sprintf("agent answer to %q starting %q (last %q)", line, prefix, got) }, func() bool {
		got = harness.AskAgent(t, addr, line)
		return strings.HasPrefix(got, prefix)
	})
	return got
}

// wantState checks a model's state on one host through GET
// /health/models/NAME, and that the status code agrees with it.
func wantState(t *testing.T, h *host, model, state string) {
	t.Helper()
	resp, err := http.Get(h.napd.URL("/health/models/" + model))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		State string `json:"state"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	wantCode := http.StatusServiceUnavailable
	if state == "awake" {
		wantCode = http.StatusOK
	}
	if body.State != state || resp.StatusCode != wantCode || (wantCode == 503) == (resp.Header.Get("Retry-After") == "") {
		t.Errorf("%s on %s: %d %q (Retry-After %q), want %d %q", model, h.name, resp.StatusCode, body.State,
			resp.Header.Get("Retry-After"), wantCode, state)
	}
}

// waitFor polls cond until it holds, failing the test after within with
// what describes then.
func waitFor(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
