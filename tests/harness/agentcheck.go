package harness

import (
	"io"
	"net"
	"testing"
	"time"
)

// AskAgent sends line to an HAProxy agent-check address (napd's
// haproxy_agent_listen), as HAProxy's agent-send does, and returns the
// answer.
func AskAgent(t testing.TB, addr, line string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("agent %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatalf("agent %s: %v", addr, err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("agent %s: %v", addr, err)
	}
	return string(b)
}
