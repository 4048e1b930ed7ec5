package daemon

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// napctl sleep reports what happened: a sleep that was done is a success
// (exit 0, "asleep") even when a request that arrived during the sleep
// call wakes the model right after, and that request is served.
func TestNapctlSleep_DoneThenWokenByQueuedRequest(t *testing.T) {
	// The engine ignores SIGTERM: the stop takes its stop_timeout, time
	// for a request to arrive while the sleep call runs.
	n := harness.Start(t, harness.Options{Models: demo("a", `stop_timeout = "2s"`, "--ignore-sigterm")})
	ctx := context.Background()
	if r := post(ctx, n, "a", harness.Chat("a", false, 1)); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("warm-up: %v", r)
	}
	type outcome struct {
		out string
		err error
	}
	slept := make(chan outcome, 1)
	go func() {
		out, err := n.Napctl("sleep", "a")
		slept <- outcome{out, err}
	}()
	n.WaitLog(`msg="putting to sleep"`, 10*time.Second)
	queued := make(chan result, 1)
	go func() { queued <- post(ctx, n, "a", harness.Chat("a", false, 1)) }()
	n.WaitLeases("a", 1, 10*time.Second)

	o := <-slept
	if o.err != nil || !strings.Contains(o.out, "a: asleep") {
		t.Errorf("napctl sleep: %v, output %q; the sleep was done", o.err, o.out)
	}
	if r := <-queued; r.err != nil || r.status != http.StatusOK {
		t.Errorf("the request queued during the sleep: %v", r)
	}
	n.WaitLog(`msg="engine stopped"`, 10*time.Second)
}
