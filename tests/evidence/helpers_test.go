//go:build linux

package evidence_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// deadline bounds every wait on an event.
const deadline = 30 * time.Second

// process is a program the test runs itself (not through napd).
type process struct {
	cmd  *exec.Cmd
	addr string // what it listens on, from its "listening" log line
}

var listenLine = regexp.MustCompile(`msg=listening addr=(\S+)`)

// demoEngineAs runs napd-demo-engine with args as uid/gid (0: the test's
// own user) and waits until it listens. The binary is copied where any
// user may run it.
func demoEngineAs(t *testing.T, uid uint32, args ...string) *process {
	t.Helper()
	bin := filepath.Join(harness.Bin(t), "napd-demo-engine")
	if uid != 0 {
		dir, err := os.MkdirTemp("", "napd-e2e-other-user-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		data, err := os.ReadFile(bin)
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err == nil {
			bin = filepath.Join(dir, "napd-demo-engine")
			err = os.WriteFile(bin, data, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatalf("napd-demo-engine %v exited before listening", args)
		}
		return &process{cmd: cmd, addr: a}
	case <-time.After(deadline):
		t.Fatalf("napd-demo-engine %v did not listen", args)
	}
	return nil
}

// stats reads a demo engine's /debug/stats.
func stats(t *testing.T, port int) map[string]any {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/stats", port))
	if err != nil {
		t.Fatalf("engine stats: %v", err)
	}
	defer resp.Body.Close()
	var s map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitState waits until the model reaches state and returns its row.
func waitState(t *testing.T, n *harness.Napd, name, state string, within time.Duration) control.ModelStatus {
	t.Helper()
	end := time.Now().Add(within)
	for {
		m := n.ModelStatus(name)
		if m.State == state {
			return m
		}
		if time.Now().After(end) {
			t.Fatalf("model %s is %s (%s), not %s after %s", name, m.State, m.Reason, state, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chat sends one chat completion through napd and returns its status and
// body.
func chat(t *testing.T, n *harness.Napd, model string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat(model, false, 2))
	if err != nil {
		t.Fatalf("chat %s: %v", model, err)
	}
	return resp.StatusCode, string(body)
}
