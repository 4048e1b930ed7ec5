package evidence_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/napd/napd/tests/harness"
)

// sleep = "llamacpp" with the demo engine's llama.cpp flavor: napd starts
// the engine with --sleep-idle-seconds from idle_timeout; the engine frees
// its weights by itself after it, its process kept; napd sees that
// through /props (never /slots, which would wake it) and shows the model
// asleep; the next request goes through a wake, an empty tokenize that
// reloads the model in the same process, and is served.
func TestLlamaCpp_OwnIdleSleep(t *testing.T) {
	port := harness.FreePort(t)
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("l",
		fmt.Sprintf("port = %d\nsleep = \"llamacpp\"\nidle_timeout = \"2s\"\nhealth_interval = \"500ms\"", port),
		"--flavor", "llamacpp", "--ttft", "0", "--memory", "64MiB")})
	if code, body := chat(t, n, "l"); code != http.StatusOK {
		t.Fatalf("chat = %d %s", code, body)
	}
	pid := enginePID(t, port)
	m := waitState(t, n, "l", "sleeping", deadline)
	if m.SleptWith != "llamacpp" || !strings.Contains(m.Reason, "went to sleep by itself") {
		t.Errorf("status %+v; want asleep by itself", m)
	}
	st := stats(t, port)
	if st["self_sleeps"] != 1.0 || st["weights_bytes"] != 0.0 || st["reloads"] != 0.0 {
		t.Errorf("engine stats %v; want one sleep of its own, weights freed, no reload (napd's probes woke nothing)", st)
	}
	if enginePID(t, port) != pid {
		t.Error("the engine process changed: its own sleep keeps it")
	}

	if code, body := chat(t, n, "l"); code != http.StatusOK {
		t.Fatalf("chat after its sleep = %d %s", code, body)
	}
	st = stats(t, port)
	if st["reloads"] != 1.0 || st["weights_bytes"] != float64(64<<20) {
		t.Errorf("engine stats %v; want one reload with the weights back", st)
	}
	if enginePID(t, port) != pid {
		t.Error("the wake restarted the engine; want the same process reloaded")
	}
	if m := n.ModelStatus("l"); m.State != "awake" {
		t.Errorf("after the request: %s (%s)", m.State, m.Reason)
	}
}
