// Package e2e runs napd as a real process against real demo engines.
package e2e

import (
	"context"
	"fmt"
	"io"
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

// A model's dedicated listen socket routes every request to that model,
// whatever the body's model field says; the shared gateway still routes by
// the field.
func TestSmoke_ModelListenSocket(t *testing.T) {
	own := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	n := harness.Start(t, harness.Options{
		Models: harness.DemoModel("m", fmt.Sprintf("sleep = \"stop\"\nlisten = %q", own), "--startup-delay", "100ms", "--model", "other-name"),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+own+"/v1/chat/completions",
		strings.NewReader(harness.Chat("other-name", false, 2)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dedicated socket: status %d body %s", resp.StatusCode, body)
	}
	// The shared gateway does not know "other-name": 404.
	resp, body, err = n.Post(ctx, "/v1/chat/completions", harness.Chat("other-name", false, 2))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("shared gateway: status %d body %s", resp.StatusCode, body)
	}
}
