package agent

import (
	"testing"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/sleepmode"
)

// napd's states in the router API's vocabulary.
func TestLoadState(t *testing.T) {
	for _, tc := range []struct {
		state lifecycle.State
		slept string
		want  gateway.LoadState
	}{
		{lifecycle.Awake, "", gateway.LoadLoaded},
		{lifecycle.Draining, "", gateway.LoadLoaded},
		{lifecycle.Unsupported, "", gateway.LoadLoaded},
		{lifecycle.Waking, "", gateway.LoadLoading},
		{lifecycle.Sleeping, sleepmode.VLLML1, gateway.LoadSleeping},
		{lifecycle.Sleeping, sleepmode.VLLML2, gateway.LoadSleeping},
		{lifecycle.Sleeping, sleepmode.SGLang, gateway.LoadSleeping},
		{lifecycle.Sleeping, sleepmode.LlamaCpp, gateway.LoadSleeping},
		{lifecycle.Sleeping, sleepmode.Stop, gateway.LoadUnloaded},
		{lifecycle.Sleeping, "", gateway.LoadUnloaded},
		{lifecycle.Unverified, "", gateway.LoadUnloaded},
		{lifecycle.Failed, "", gateway.LoadUnloaded},
	} {
		s := model.Snapshot{Lifecycle: lifecycle.Snapshot{State: tc.state}, Slept: tc.slept}
		if got := loadState(s); got != tc.want {
			t.Errorf("%s (slept %q): %s, want %s", tc.state, tc.slept, got, tc.want)
		}
	}
	var info gateway.ModelInfo
	routerInfo(&info, model.Snapshot{Lifecycle: lifecycle.Snapshot{State: lifecycle.Failed}})
	if !info.Failed || info.Load != gateway.LoadUnloaded {
		t.Errorf("a failed model: %+v", info)
	}
}

// One load per model at a time.
func TestLoads(t *testing.T) {
	var l loads
	if !l.start("a") || l.start("a") || !l.start("b") {
		t.Fatal("want one load per model")
	}
	l.done("a")
	if !l.start("a") {
		t.Error("a load after the last one ended")
	}
}
