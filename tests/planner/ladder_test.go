package planner

import (
	"context"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// The sleep ladder: a model put to sleep with vllm-l1 (the engine records
// level 1) is stopped after deep_sleep_after, or at once under host memory
// pressure; its next wake starts the engine anew (the path for the level
// reached) and the request gets 200.
func TestLadder_LightSleepMovesToStop(t *testing.T) {
	for _, tc := range []struct {
		name, policy, pressure, reason string
	}{
		{"after deep_sleep_after", harness.DefaultPolicy + "deep_sleep = \"stop\"\ndeep_sleep_after = \"2s\"\n", "", "deep-sleep"},
		{"under host pressure", "", `host_reserve = "1000TiB"` + "\n", "host-pressure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := harness.Start(t, harness.Options{
				Policy:   tc.policy,
				Pressure: tc.pressure,
				Models: harness.DemoModel("m", "sleep = \"vllm-l1\"\nidle_timeout = \"4s\"\nenvironment = { VLLM_SERVER_DEV_MODE = \"1\" }\n",
					"--startup-delay", "200ms", "--sleep-mode"),
			})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if resp, body := post(t, n, ctx, "m", 2); resp.StatusCode != http.StatusOK {
				t.Fatalf("m: %d %s", resp.StatusCode, body)
			}
			if out, err := n.Napctl("sleep", "m"); err != nil {
				t.Fatalf("napctl sleep: %v\n%s", err, out)
			}
			n.WaitLog(`msg="engine asleep" backend=exec model=m strategy=vllm-l1`, 10*time.Second)
			n.WaitLog(`msg="sleeping deeper" model=m from=vllm-l1 strategy=stop reason=`+tc.reason, 30*time.Second)
			n.WaitLog(`msg="engine asleep" backend=exec model=m strategy=stop`, 30*time.Second)
			if !regexp.MustCompile(`msg="planner decision" model=m .*decision.reason=` + tc.reason).MatchString(n.Log()) {
				t.Errorf("the log lacks the %s decision", tc.reason)
			}
			if s := statusOf(t, n, "m"); s.SleptWith != "stop" {
				t.Errorf("status: slept_with %q, want stop", s.SleptWith)
			}
			logs, _ := n.Napctl("logs", "m")
			if !regexp.MustCompile(`sleeping.*level=1`).MatchString(logs) {
				t.Errorf("the engine did not record a level-1 sleep:\n%s", logs)
			}
			if resp, body := post(t, n, ctx, "m", 2); resp.StatusCode != http.StatusOK {
				t.Fatalf("m after the ladder: %d %s", resp.StatusCode, body)
			}
			if got := engineStarts(n); got != 2 {
				t.Errorf("%d engine starts, want 2 (the wake after a stop starts the engine)", got)
			}
		})
	}
}
