// Package e2e runs napd as a real process against real demo engines.
package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// A request for a sleeping model wakes it, waits, and is answered; the reply
// says how long the wake took.
func TestSmoke_WakeOnDemand(t *testing.T) {
	n := harness.Start(t, harness.Options{
		Models: harness.DemoModel("m", `sleep = "stop"`, "--startup-delay", "300ms"),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 4))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "tok") {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Napd-Wake-Ms") == "" || resp.Header.Get("X-Queue-Depth") == "" {
		t.Errorf("headers = %v", resp.Header)
	}
	out, err := n.Napctl("status")
	if err != nil || !strings.Contains(out, "awake") {
		t.Errorf("napctl status: %v\n%s", err, out)
	}
}
