package daemon

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// A SIGKILLed napd leaves nothing behind under the exec supervisor. The
// engine is a wrapper shell (the group leader, killed with napd) around a
// demo engine and a sleeping helper; both of those survive napd's death.
// The restarted napd kills them before it serves, starts a fresh engine on
// the remembered port, and its SIGTERM then leaves no process at all.
func TestCrash_SIGKILLedNapdLeavesNothingBehind(t *testing.T) {
	mark := fmt.Sprintf("crash-%d", time.Now().UnixNano())
	n := harness.Start(t, harness.Options{Models: fmt.Sprintf(`[models.a]
command = ["sh", "-c", "sleep 600 & ${BIN}/napd-demo-engine --host 127.0.0.1 --port ${PORT} --model a & wait"]
environment = { %s = %q }
`, harness.MarkEnv, mark)})
	t.Cleanup(func() {
		for _, pid := range harness.Marked(mark) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	ctx := context.Background()
	if r := post(ctx, n, "a", harness.Chat("a", false, 2)); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("first request: %v", r)
	}
	if got := len(harness.Marked(mark)); got != 3 {
		t.Fatalf("%d engine processes, want 3 (shell, engine, helper)", got)
	}

	n.Kill()
	// The shell dies with napd; the engine and its helper do not.
	deadline := time.Now().Add(10 * time.Second)
	for len(harness.Marked(mark)) != 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := harness.Marked(mark); len(left) != 2 {
		t.Fatalf("after SIGKILL: %d engine processes, want the 2 the shell spawned", len(left))
	}

	n.Launch()
	if left := harness.Marked(mark); len(left) != 0 {
		t.Errorf("restarted napd serves while %d processes of the old engine run: %v", len(left), left)
	}
	n.WaitLog("killing what an engine of a previous napd left running", 5*time.Second)
	if r := post(ctx, n, "a", harness.Chat("a", false, 2)); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("request after the restart: %v", r)
	}
	n.Signal(syscall.SIGTERM)
	if err := n.Wait(30 * time.Second); err != nil {
		t.Fatalf("napd exit: %v", err)
	}
	if left := harness.Marked(mark); len(left) != 0 {
		t.Errorf("after SIGTERM %d engine processes run: %v", len(left), left)
	}
}
