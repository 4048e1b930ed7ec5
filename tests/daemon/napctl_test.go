package daemon

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// napctl against a running napd, one command after the other: status
// (table and --json), wake with progress lines, a failing wake, reset,
// sleep with a strategy, events -f, reload, config check.
func TestNapctl_Commands(t *testing.T) {
	n := harness.Start(t, harness.Options{
		Models: harness.DemoModel("m", `sleep = "vllm-l1"
aliases = ["default"]
environment = { VLLM_SERVER_DEV_MODE = "1" }`, "--startup-delay", "200ms", "--sleep-mode", "--wake-delay", "100ms") +
			demo("bad", "", "--fail-start"),
		Policy: strings.Replace(harness.DefaultPolicy, "wake_attempts = 3", "wake_attempts = 1", 1),
	})
	napctl := func(t *testing.T, wantOK bool, args ...string) string { return runNapctl(t, n, wantOK, args...) }

	t.Run("status", func(t *testing.T) {
		out := napctl(t, true, "status")
		if !regexp.MustCompile(`(?m)^MODEL\s+STATE\s+LEASES\s+QUEUE\s+IDLE\s+LAST WAKE\s+MEMORY\s+GPU\s+REASON$`).MatchString(out) {
			t.Errorf("status has no table header:\n%s", out)
		}
		for _, m := range []string{"m", "bad"} {
			if !regexp.MustCompile(`(?m)^` + m + `\s+sleeping\s+0\s+0\s`).MatchString(out) {
				t.Errorf("status has no sleeping row for %s:\n%s", m, out)
			}
		}
		var st control.Status
		if err := json.Unmarshal([]byte(napctl(t, true, "status", "--json")), &st); err != nil {
			t.Fatalf("status --json: %v", err)
		}
		if st.Supervisor != "exec" || len(st.Models) != 2 || st.Models[0].Name != "m" || st.Models[0].State != "sleeping" ||
			st.Models[0].Sleep != "vllm-l1" || st.Models[0].Port == 0 {
			t.Errorf("status --json = %+v", st)
		}
	})

	t.Run("wake", func(t *testing.T) {
		out := napctl(t, true, "wake", "default") // by alias
		// Not a terminal: one plain line per phase, then the result; no
		// terminal control sequences.
		if !regexp.MustCompile(`(?m)^default: sleeping \(\d+ms\)$`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^default: waking \(\d+ms\)$`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^default: awake after \S+$`).MatchString(out) || strings.Contains(out, "\033") ||
			strings.Count(out, "awake") != 1 {
			t.Errorf("wake output:\n%q", out)
		}
		if !regexp.MustCompile(`(?m)^m\s+awake\s`).MatchString(napctl(t, true, "status")) {
			t.Errorf("m not awake after napctl wake")
		}
	})

	t.Run("wake failure", func(t *testing.T) {
		out := napctl(t, false, "wake", "bad")
		last := lastLine(out)
		if !strings.HasPrefix(last, "napctl: wake bad failed after ") || !strings.Contains(last, "exit status 1") {
			t.Errorf("failed wake's last line %q does not give the reason\n%s", last, out)
		}
		if !regexp.MustCompile(`(?m)^bad\s+failed\s.*exit status 1`).MatchString(napctl(t, true, "status")) {
			t.Errorf("bad not failed with its reason in status")
		}
		// A failed model refuses another wake at once, saying why.
		out = napctl(t, false, "wake", "bad")
		if !strings.Contains(lastLine(out), "exit status 1") {
			t.Errorf("wake of a failed model: %q", out)
		}
	})

	t.Run("logs", func(t *testing.T) {
		// m was woken above: its engine's output says where it listens.
		out := napctl(t, true, "logs", "m", "-n", "20")
		if !strings.Contains(out, "msg=listening") {
			t.Errorf("napctl logs m: %q", out)
		}
		if out := napctl(t, false, "logs", "ghost"); !strings.Contains(out, "no such model") {
			t.Errorf("napctl logs ghost: %q", out)
		}
	})

	t.Run("reset", func(t *testing.T) {
		if out := napctl(t, true, "reset", "bad"); strings.TrimSpace(out) != "bad: reset" {
			t.Errorf("reset output %q", out)
		}
		if !regexp.MustCompile(`(?m)^bad\s+sleeping\s`).MatchString(napctl(t, true, "status")) {
			t.Errorf("bad not sleeping after reset:\n%s", napctl(t, true, "status"))
		}
	})

	t.Run("sleep", func(t *testing.T) {
		// The model's own strategy (vllm-l1): the engine process stays.
		pids := enginePIDs(n)["m"]
		if out := napctl(t, true, "sleep", "m"); strings.TrimSpace(out) != "m: asleep" {
			t.Errorf("sleep output %q", out)
		}
		if len(pids) != 1 || !alive(pids[0]) {
			t.Errorf("vllm-l1 sleep stopped the engine (pids %v)", pids)
		}
		napctl(t, true, "wake", "m")
		// --strategy overrides it, before or after MODEL: stop ends the process.
		if out := napctl(t, true, "sleep", "m", "--strategy", "stop"); strings.TrimSpace(out) != "m: asleep" {
			t.Errorf("sleep --strategy output %q", out)
		}
		waitGone(t, pids[0], 5*time.Second)
		if out := napctl(t, false, "sleep", "--strategy", "bogus", "m"); !strings.Contains(out, `unknown strategy "bogus"`) {
			t.Errorf("sleep with a bad strategy: %q", out)
		}
	})

	t.Run("events", func(t *testing.T) {
		var out lockedBuffer
		cmd := exec.Command(filepath.Join(harness.Bin(t), "napctl"), "--socket", n.Socket, "events", "-f")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		// The stream has no history: wake and sleep until the follower,
		// once subscribed, has seen a wake.
		woke := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\.\d{3} m state sleeping→waking \(woken by a request\)$`)
		deadline := time.Now().Add(10 * time.Second)
		for !woke.MatchString(out.String()) {
			if time.Now().After(deadline) {
				t.Fatalf("events -f printed no wake:\n%s", out.String())
			}
			napctl(t, true, "wake", "m")
			napctl(t, true, "sleep", "m")
		}
		if !strings.Contains(out.String(), "m state waking→awake") || !strings.Contains(out.String(), "m wake in ") {
			t.Errorf("events -f output:\n%s", out.String())
		}
	})

	t.Run("reload", func(t *testing.T) {
		if out := napctl(t, true, "reload"); strings.TrimSpace(out) != "config reloaded" {
			t.Errorf("reload output %q", out)
		}
		good, err := os.ReadFile(n.Config)
		if err != nil {
			t.Fatal(err)
		}
		defer os.WriteFile(n.Config, good, 0o644)
		if err := os.WriteFile(n.Config, append(good, []byte("\n[policy]\n")...), 0o644); err != nil {
			t.Fatal(err)
		}
		out := napctl(t, false, "reload")
		if !strings.HasPrefix(out, "napctl: ") || !strings.Contains(out, "napd.toml:") {
			t.Errorf("refused reload: %q", out)
		}
		// With only --config, napctl finds the socket in the file even
		// while a value in it is wrong, and shows napd's refusal.
		bad := strings.Replace(string(good), `sleep = "vllm-l1"`, `sleep = "deep"`, 1)
		if err := os.WriteFile(n.Config, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(harness.Bin(t), "napctl"), "--config", n.Config, "reload")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		b, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(b), "models.m.sleep") {
			t.Errorf("reload of a config with a bad value, socket from --config: err %v, %q", err, b)
		}
	})

	t.Run("config check", func(t *testing.T) {
		if out := napctl(t, true, "config", "check"); strings.TrimSpace(out) != n.Config+": ok (2 models)" {
			t.Errorf("config check: %q", out)
		}
		bad := filepath.Join(t.TempDir(), "bad.toml")
		if err := os.WriteFile(bad, []byte("[agent]\nsupervisor = \"exec\"\n\n[policy]\nidle_timeout = 5\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out := napctl(t, false, "config", "check", bad)
		if !strings.Contains(out, bad+":5: policy.idle_timeout") {
			t.Errorf("config check of a bad file: %q", out)
		}
	})

	t.Run("errors", func(t *testing.T) {
		out := napctl(t, false, "wake", "nosuch")
		if strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, `no such model: "nosuch"`) {
			t.Errorf("wake of an unknown model: %q, want one line naming it", out)
		}
		cmd := exec.Command(filepath.Join(harness.Bin(t), "napctl"), "--socket", filepath.Join(t.TempDir(), "none.sock"), "status")
		b, err := cmd.CombinedOutput()
		if err == nil || strings.Count(strings.TrimSpace(string(b)), "\n") != 0 {
			t.Errorf("status without napd: err %v, output %q, want one error line", err, b)
		}
	})

	t.Run("help", func(t *testing.T) {
		for _, c := range [][]string{{"status"}, {"wake"}, {"sleep"}, {"reset"}, {"logs"}, {"events"}, {"reload"}, {"config", "check"}} {
			out := napctl(t, true, append(c, "--help")...)
			if !strings.HasPrefix(out, "usage: napctl "+strings.Join(c, " ")) {
				t.Errorf("%s --help: %q", strings.Join(c, " "), out)
			}
		}
		if out := napctl(t, true, "--help"); !strings.Contains(out, "config check [FILE]") {
			t.Errorf("napctl --help: %q", out)
		}
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// lockedBuffer is a bytes.Buffer a child process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runNapctl runs napctl against n and fails t unless it succeeds (or, when
// not wantOK, fails); it returns the combined output.
func runNapctl(t *testing.T, n *harness.Napd, wantOK bool, args ...string) string {
	t.Helper()
	out, err := n.Napctl(args...)
	if (err == nil) != wantOK {
		t.Fatalf("napctl %s: err %v (want ok %v)\n%s", strings.Join(args, " "), err, wantOK, out)
	}
	return out
}
