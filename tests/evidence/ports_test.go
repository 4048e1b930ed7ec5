package evidence_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/napd/napd/tests/harness"
)

// A process of another user listening on a sleeping model's port: the wake
// fails naming it, and it receives nothing (no request, no health probe).
func TestWake_PortHeldByAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as nobody")
	}
	port := harness.FreePort(t)
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("m2",
		fmt.Sprintf("port = %d\nwake_attempts = 1", port), "--flavor", "generic", "--ttft", "0")})
	waitState(t, n, "m2", "sleeping", deadline)

	thief := demoEngineAs(t, 65534, "--port", fmt.Sprint(port), "--flavor", "generic")
	pid := thief.cmd.Process.Pid

	code, body := chat(t, n, "m2")
	want := fmt.Sprintf("port %d is held by pid %d (napd-demo-engin), not by the engine of m2", port, pid)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
		t.Fatalf("chat = %d %s\nwant 503 with %q", code, body, want)
	}
	if m := n.ModelStatus("m2"); m.State != "failed" || !strings.Contains(m.Reason, want) {
		t.Errorf("status %s (%s), want failed with %q", m.State, m.Reason, want)
	}
	// The only connection it ever accepted is this one.
	if s := stats(t, port); s["connections"] != float64(1) || s["completions"] != float64(0) {
		t.Errorf("the other user's process received something: %v", s)
	}
}
