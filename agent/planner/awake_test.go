package planner

import (
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/sleepmode"
)

func keepAwake(m *Model) { m.KeepAwake = true }

// A model inside a keep_awake window is not put to sleep for idleness;
// GPU pressure may still take it.
func TestPlan_KeepAwakeWindow(t *testing.T) {
	in := roomy(model("w", idleFor(time.Hour), keepAwake), model("plain", idleFor(time.Hour)))
	res := Plan(in)
	if len(res.Decisions) != 1 || res.Decisions[0].Model != "plain" {
		t.Errorf("decisions %+v: want only plain's idle sleep", res.Decisions)
	}
	in = gpuFree(roomy(model("w", idleFor(time.Hour), keepAwake, footprint(10*GiB))), 0, 0)
	if res := Plan(in); len(res.Decisions) != 1 || res.Decisions[0].Reason != ReasonGPUPressure {
		t.Errorf("decisions %+v: want w slept for GPU pressure", res.Decisions)
	}
}

func TestPlanMaxAwake(t *testing.T) {
	names := func(ds []Decision) string {
		var s []string
		for _, d := range ds {
			s = append(s, d.Model+"/"+string(d.Reason))
		}
		return strings.Join(s, ",")
	}
	just := idleFor(time.Second) // within the idle minimum: demand overrides it
	tests := []struct {
		name  string
		in    Input
		max   int
		sleep string
		wait  bool
	}{
		{"unlimited", roomy(model("a"), model("b")), 0, "", false},
		{"within", roomy(model("a"), model("new", state(lifecycle.Waking))), 2, "", false},
		{"LRU idle makes room", roomy(model("old", idleFor(time.Hour)), model("recent", just), model("new", state(lifecycle.Waking))), 2, "old/max-awake", false},
		{"two over", roomy(model("a", idleFor(3*time.Hour)), model("b", idleFor(2*time.Hour)), model("c", just), model("new", state(lifecycle.Waking))), 1, "a/max-awake,b/max-awake,c/max-awake", false},
		{"busy and pinned wait", roomy(model("busy", leases(1)), model("pin", pinned), model("new", state(lifecycle.Waking))), 2, "", true},
		{"sleeping and draining do not count", roomy(model("s", state(lifecycle.Sleeping)), model("d", state(lifecycle.Draining)), model("new", state(lifecycle.Waking))), 1, "", false},
		{"another waking counts", roomy(model("w", state(lifecycle.Waking)), model("new", state(lifecycle.Waking))), 1, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PlanMaxAwake(tt.in, "new", tt.max)
			if names(got.Sleeps) != tt.sleep || got.Wait != tt.wait {
				t.Errorf("sleeps %q wait %v (%s), want %q wait %v", names(got.Sleeps), got.Wait, got.Message, tt.sleep, tt.wait)
			}
		})
	}
}

// The sleep ladder: a model asleep in a light strategy is stopped once it
// slept deep_sleep_after; not before, not without deep_sleep, not when it
// sleeps by stop already or its sleep is unknown.
func TestPlan_DeepSleep(t *testing.T) {
	slept := func(strategy string, ago time.Duration) opt {
		return func(m *Model) {
			m.State, m.Sleep, m.Slept, m.SleptAt = lifecycle.Sleeping, strategy, strategy, now.Add(-ago)
			m.DeepSleep, m.DeepSleepAfter = sleepmode.Stop, time.Hour
		}
	}
	noLadder := func(m *Model) { m.DeepSleep = sleepmode.None }
	in := roomy(
		model("l1", slept(sleepmode.VLLML1, 2*time.Hour), hostBytes(30*GiB)),
		model("l2", slept(sleepmode.VLLML2, time.Hour)),
		model("llama", slept(sleepmode.LlamaCpp, time.Hour)), // asleep by itself: its process stays
		model("young", slept(sleepmode.VLLML1, 59*time.Minute)),
		model("off", slept(sleepmode.VLLML1, 2*time.Hour), noLadder),
		model("stopped", slept(sleepmode.Stop, 2*time.Hour)),
		model("unknown", slept(sleepmode.VLLML1, 2*time.Hour), func(m *Model) { m.Slept = "" }),
	)
	res := Plan(in)
	var got []string
	for _, d := range res.Decisions {
		got = append(got, d.Model+"/"+string(d.Action)+"/"+string(d.Reason))
		if d.Model == "l1" && (d.FreesHost != 30*GiB || d.Message != "stop l1: asleep (vllm-l1) for 2h0m0s, deep_sleep_after 1h0m0s") {
			t.Errorf("l1: %+v", d)
		}
	}
	if strings.Join(got, ",") != "l1/stop/deep-sleep,l2/stop/deep-sleep,llama/stop/deep-sleep" {
		t.Errorf("decisions %v", got)
	}
}
