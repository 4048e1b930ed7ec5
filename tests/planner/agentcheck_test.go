package planner

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// TestRoom_AgentCheckDrainsAWakeWaitingForRoom: while b's wake waits for
// the GPU memory a busy a holds, napd's HAProxy agent check answers drain
// for b, so a balancer sends b's next requests to another host; once b is
// awake it answers up again.
func TestRoom_AgentCheckDrainsAWakeWaitingForRoom(t *testing.T) {
	agent := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	n := twoThatDoNotFitWith(t, harness.Options{Agent: fmt.Sprintf("haproxy_agent_listen = %q", agent)}, "", "")
	finish := stream(t, n, "a", 300) // 6 s at 50 tokens per second
	type answer struct {
		status int
		body   string
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		status, body, _, err := send(n, "b", false, 2, time.Minute)
		got <- answer{status, body, err}
	}()
	n.WaitLog(`msg="waiting for GPU memory" model=b`, 30*time.Second)
	// The desk logs the wait before b's own state shows it (a moment later,
	// on b's loop): the agent check answers from b's state.
	for _, line := range []string{"b\n", "b awake\n"} {
		a := ""
		for end := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if a = harness.AskAgent(t, agent, line); strings.HasPrefix(a, "up drain #waiting for room, ") || time.Now().After(end) {
				break
			}
		}
		if !strings.HasPrefix(a, "up drain #waiting for room, ") {
			t.Errorf("agent answer to %q while b waits for room: %q, want up drain", line, a)
		}
	}
	if a := harness.AskAgent(t, agent, "a awake\n"); !strings.HasPrefix(a, "up ready 100% #awake, ") {
		t.Errorf("agent answer for the busy holder a: %q", a)
	}
	if whole, _ := finish(); !whole {
		t.Error("a's stream did not arrive whole")
	}
	if b := <-got; b.err != nil || b.status != http.StatusOK {
		t.Fatalf("b: %d %v %s", b.status, b.err, b.body)
	}
	if a := harness.AskAgent(t, agent, "b awake\n"); a != "up ready 100% #awake, 0 queued\n" {
		t.Errorf("agent answer for b once awake: %q", a)
	}
	if a := harness.AskAgent(t, agent, "a\n"); a != "up ready 1% #sleeping, 0 queued\n" {
		t.Errorf("agent answer for a once it yielded: %q", a)
	}
}
