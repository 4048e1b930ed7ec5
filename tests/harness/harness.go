//go:build linux

// Package harness runs the real napd binary for end-to-end tests: it builds
// napd, napctl and napd-demo-engine once per test binary, writes a config,
// starts napd as a process, waits until it serves, and stops it at the end
// of the test.
//
// It is for tests only. Ports come from FreePort; a test must not pick its
// own.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// BinEnv names a directory that holds the three programs already built:
// where a test binary runs without the source tree's toolchain (inside the
// systemd box), Bin uses it instead of building.
const BinEnv = "NAPD_TEST_BIN"

// Bin builds the three programs (once per test binary) and returns the
// directory holding them.
func Bin(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv(BinEnv); dir != "" {
		return dir
	}
	buildOnce.Do(func() {
		var dir string
		dir, buildErr = os.MkdirTemp("", "napd-e2e-bin-")
		if buildErr != nil {
			return
		}
		binDir = dir
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/napd", "./cmd/napctl", "./cmd/napd-demo-engine")
		cmd.Dir = RepoRoot()
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// RepoRoot is the module's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Napd is a running napd process.
type Napd struct {
	t       testing.TB
	Dir     string // scratch dir: config, state, control socket
	Config  string // config file path
	Addr    string // gateway host:port
	Metrics string // metrics host:port
	Socket  string // control socket path
	Cmd     *exec.Cmd
	log     *syncBuffer
	done    chan struct{}
	waitErr error
}

// Options shape the generated config.
type Options struct {
	// Models is the TOML of the [models.*] tables (and anything else to
	// append verbatim). "${BIN}" is replaced by the binaries' directory.
	Models string
	// Policy is the body of the [policy] table ("" = small test defaults).
	Policy string
	// Agent is extra lines for the [agent] table.
	Agent string
	// Listen is the gateway's address ("" = 127.0.0.1 on a FreePort).
	Listen string
	// Gateway is extra lines for the [gateway] table.
	Gateway string
	// Pressure is the body of the [pressure] table ("" = defaults).
	Pressure string
	// Env is extra environment for napd (e.g. PATH with a fake nvidia-smi).
	Env []string
	// LogLevel defaults to "debug".
	LogLevel string
	// Supervisor is agent.supervisor ("" = "exec").
	Supervisor string
}

// DefaultPolicy keeps tests quick: short timeouts, everything unloadable.
const DefaultPolicy = `idle_timeout = "1h"
drain_timeout = "5s"
wake_timeout = "20s"
wake_attempts = 3
allow_untracked_unload = false
`

// WriteConfig writes a napd config for opts under dir and returns its path
// and the gateway, metrics and socket addresses.
func WriteConfig(t testing.TB, dir string, o Options) (path, addr, metrics, socket string) {
	t.Helper()
	bin := Bin(t)
	addr = o.Listen
	if addr == "" {
		addr = fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	}
	metrics = fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	socket = filepath.Join(dir, "control.sock")
	policy := o.Policy
	if policy == "" {
		policy = DefaultPolicy
	}
	level := o.LogLevel
	if level == "" {
		level = "debug"
	}
	supervisor := o.Supervisor
	if supervisor == "" {
		supervisor = "exec"
	}
	cfg := fmt.Sprintf(`[agent]
supervisor = %q
state_dir = %q
control_socket = %q
metrics_listen = %q
log_level = %q
%s

[gateway]
listen = [%q]
%s

[policy]
%s

[pressure]
%s

%s
`, supervisor, filepath.Join(dir, "state"), socket, metrics, level, o.Agent, addr, o.Gateway, policy, o.Pressure,
		strings.ReplaceAll(o.Models, "${BIN}", bin))
	path = filepath.Join(dir, "napd.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, addr, metrics, socket
}

// Start writes a config and starts napd on it, waiting until the gateway
// answers /health. napd is stopped (SIGTERM, then SIGKILL) when the test
// ends; its log is printed if the test failed.
func Start(t testing.TB, o Options) *Napd {
	t.Helper()
	dir, err := os.MkdirTemp("", "napd-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path, addr, metrics, socket := WriteConfig(t, dir, o)
	n := &Napd{t: t, Dir: dir, Config: path, Addr: addr, Metrics: metrics, Socket: socket}
	n.start(o.Env)
	return n
}

func (n *Napd) start(env []string) {
	t := n.t
	if n.log == nil { // a restart after Kill keeps writing the same log
		n.log = &syncBuffer{}
	}
	n.done = make(chan struct{})
	n.Cmd = exec.Command(filepath.Join(Bin(t), "napd"), "--config", n.Config)
	n.Cmd.Env = append(append(os.Environ(), "PATH="+Bin(t)+":"+os.Getenv("PATH")), env...)
	n.Cmd.Stdout = n.log
	n.Cmd.Stderr = n.log
	n.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		n.waitErr = n.Cmd.Wait()
		close(n.done)
	}()
	t.Cleanup(func() {
		n.Stop()
		if t.Failed() {
			t.Logf("napd log:\n%s", n.Log())
		}
	})
	n.WaitReady(15 * time.Second)
}

// WaitReady waits until the gateway answers /health and the control
// socket accepts connections: napd serves /health before it has bound the
// socket, so a napctl right after Start could otherwise find none.
func (n *Napd) WaitReady(within time.Duration) {
	n.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			n.t.Fatalf("napd exited before it was ready: %v\n%s", n.waitErr, n.Log())
		default:
		}
		resp, err := http.Get("http://" + n.Addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && n.controlUp() {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.t.Fatalf("napd not ready (gateway /health and control socket) within %s\n%s", within, n.Log())
}

// controlUp reports whether napd's control socket accepts a connection.
func (n *Napd) controlUp() bool {
	c, err := net.DialTimeout("unix", n.Socket, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Signal sends sig to napd.
func (n *Napd) Signal(sig os.Signal) {
	if err := n.Cmd.Process.Signal(sig); err != nil {
		n.t.Fatal(err)
	}
}

// Wait waits for napd to exit and returns its exit error.
func (n *Napd) Wait(within time.Duration) error {
	n.t.Helper()
	select {
	case <-n.done:
		return n.waitErr
	case <-time.After(within):
		n.t.Fatalf("napd did not exit within %s", within)
		return nil
	}
}

// Stop stops napd: SIGTERM, then SIGKILL after 20 s. It is idempotent.
func (n *Napd) Stop() {
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		_ = n.Cmd.Process.Kill()
		<-n.done
	}
}

// Log is everything napd wrote so far.
func (n *Napd) Log() string { return n.log.String() }

// URL is the gateway URL of path.
func (n *Napd) URL(path string) string { return "http://" + n.Addr + path }

// Post sends a JSON body to the gateway and returns the response with its
// body read.
func (n *Napd) Post(ctx context.Context, path, body string, header ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL(path), strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// MetricsText is napd's /metrics as it serves it.
func (n *Napd) MetricsText() string {
	n.t.Helper()
	resp, err := http.Get("http://" + n.Metrics + "/metrics")
	if err != nil {
		n.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		n.t.Fatal(err)
	}
	return string(b)
}

// Napctl runs napctl against this napd and returns its combined output.
func (n *Napd) Napctl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(Bin(n.t), "napctl"), append([]string{"--socket", n.Socket, "--config", n.Config}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// WaitLog waits until napd's log contains substr.
func (n *Napd) WaitLog(substr string, within time.Duration) {
	n.t.Helper()
	n.waitLog(strconv.Quote(substr), within, func(log string) bool { return strings.Contains(log, substr) })
}

// GPUSource waits for napd's choice of GPU probe and returns it: "nvml",
// "nvidia-smi", or "" for none (no nvidia-smi on PATH, or one that fails).
// NVML's absence is logged before the nvidia-smi fallback is tried, so a
// first "gpu probe" line does not tell the choice yet.
func (n *Napd) GPUSource(within time.Duration) string {
	n.t.Helper()
	var source string
	n.waitLog("choice of GPU probe", within, func(log string) bool {
		if _, rest, ok := strings.Cut(log, `msg="gpu probe" source=`); ok {
			source = strings.Fields(rest)[0]
			return true
		}
		return strings.Contains(log, "gpu probe: no nvidia-smi") || strings.Contains(log, "gpu probe: nvidia-smi fails")
	})
	return source
}

// waitLog waits until ok holds for napd's log; what names it for the
// failure.
func (n *Napd) waitLog(what string, within time.Duration, ok func(log string) bool) {
	n.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if ok(n.Log()) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.t.Fatalf("napd log has no %s within %s", what, within)
}

// ModelStatus reads one model's row from napd's control API (what
// `napctl status --json` prints); the test fails when it has none.
func (n *Napd) ModelStatus(name string) control.ModelStatus {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := control.NewClient(n.Socket).Status(ctx)
	if err != nil {
		n.t.Fatalf("control status: %v", err)
	}
	for _, m := range st.Models {
		if m.Name == name {
			return m
		}
	}
	n.t.Fatalf("no model %q in status %+v", name, st)
	return control.ModelStatus{}
}

// WaitModel waits until model's status row satisfies ok, and returns it;
// the test fails after within.
func (n *Napd) WaitModel(model string, within time.Duration, ok func(control.ModelStatus) bool) control.ModelStatus {
	n.t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := n.ModelStatus(model)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("%s's status within %s: %+v\n%s", model, within, s, n.Log())
		}
		time.Sleep(50 * time.Millisecond) // status changes within a second
	}
}

// Chat is a small chat-completion body for model.
func Chat(model string, stream bool, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`,
		model, stream, maxTokens)
}

// DemoModel is a [models.NAME] table running the demo engine with the
// given flags, plus extra TOML lines (sleep, idle_timeout, …).
func DemoModel(name, extra string, flags ...string) string {
	args := []string{`"${BIN}/napd-demo-engine"`, `"--host"`, `"127.0.0.1"`, `"--port"`, `"${PORT}"`, `"--model"`, fmt.Sprintf("%q", name)}
	for _, f := range flags {
		args = append(args, fmt.Sprintf("%q", f))
	}
	return fmt.Sprintf("[models.%s]\ncommand = [%s]\n%s\n", name, strings.Join(args, ", "), extra)
}

// Lines splits a log into lines.
func Lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
