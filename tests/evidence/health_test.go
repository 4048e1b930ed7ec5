package evidence_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/napd/napd/probes/sockets"
	"github.com/napd/napd/tests/harness"
)

// enginePID is the process listening on the engine's port.
func enginePID(t *testing.T, port int) int {
	t.Helper()
	tab, err := sockets.Reader{}.Read()
	if err != nil {
		t.Fatal(err)
	}
	ls := tab.Listeners(port, nil)
	if len(ls) != 1 || ls[0].PID == 0 {
		t.Fatalf("listeners on %d: %+v", port, ls)
	}
	return ls[0].PID
}

// A SIGSTOPped awake engine is found out by its failing health probes
// (no progress meanwhile), and replaced on the next request.
func TestHealth_StoppedEngineReplaced(t *testing.T) {
	port := harness.FreePort(t)
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("g",
		fmt.Sprintf("port = %d\nhealth_interval = \"500ms\"\nhealth_failures = 2\nstop_timeout = \"2s\"", port),
		"--flavor", "generic", "--ttft", "0")})
	if code, body := chat(t, n, "g"); code != http.StatusOK {
		t.Fatalf("chat = %d %s", code, body)
	}
	old := enginePID(t, port)
	if err := syscall.Kill(old, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(old, syscall.SIGKILL) })

	m := waitState(t, n, "g", "unverified", deadline)
	if !strings.Contains(m.Reason, "engine stopped answering") || m.Attempts != 1 {
		t.Errorf("unverified for %q (%d attempts spent), want the health probes named and one attempt", m.Reason, m.Attempts)
	}
	if code, body := chat(t, n, "g"); code != http.StatusOK {
		t.Fatalf("chat after the hang = %d %s", code, body)
	}
	if now := enginePID(t, port); now == old {
		t.Errorf("still served by the stopped engine %d", old)
	}
}

// An engine that answers no health probe while it streams a long answer
// is not taken for hung: the bytes it sends are its progress.
func TestHealth_LongStreamNotKilled(t *testing.T) {
	tab, err := sockets.Reader{}.Read()
	if err != nil || tab.Source != "netlink" {
		t.Skip("progress of an engine without metrics needs netlink sock_diag")
	}
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("g",
		"health_interval = \"300ms\"\nhealth_failures = 2",
		"--flavor", "generic", "--busy-health", "--ttft", "0", "--tokens-per-second", "25")})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.URL("/v1/chat/completions"),
		strings.NewReader(harness.Chat("g", true, 100))) // 4 s of tokens: many failed probes
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	chunks, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			chunks++
			done = line == "[DONE]"
		}
	}
	if !done || chunks < 100 {
		t.Fatalf("stream cut after %d chunks (done %v): %v", chunks, done, sc.Err())
	}
	if m := n.ModelStatus("g"); m.State != "awake" || m.Attempts != 0 {
		t.Errorf("after the stream: %s (%s), %d attempts", m.State, m.Reason, m.Attempts)
	}
	if strings.Contains(n.Log(), "engine stopped answering") {
		t.Error("the streaming engine was taken for hung")
	}
	if !strings.Contains(n.Log(), "health probe failed") {
		t.Error("no health probe failed during the stream: the test proves nothing")
	}
}
