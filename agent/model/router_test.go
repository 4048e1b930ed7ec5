package model

import (
	"context"
	"testing"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
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
		s := Snapshot{Lifecycle: lifecycle.Snapshot{State: tc.state}, Slept: tc.slept}
		if got := s.LoadState(); got != tc.want {
			t.Errorf("%s (slept %q): %s, want %s", tc.state, tc.slept, got, tc.want)
		}
	}
	var info gateway.ModelInfo
	Snapshot{Lifecycle: lifecycle.Snapshot{State: lifecycle.Failed}}.RouterInfo(&info)
	if !info.Failed || info.Load != gateway.LoadUnloaded {
		t.Errorf("a failed model: %+v", info)
	}
}

// A router API load wakes the model once: a second one while the first
// is under way is refused, and one after it ended is taken.
func TestLoad_OneAtATime(t *testing.T) {
	r := newRig(t, supervisor.Stopped, nil)
	if !r.m.Load(context.Background(), "ui", 0) {
		t.Fatal("the first load was refused")
	}
	wake := r.next("wake")
	if r.m.Load(context.Background(), "ui", 0) {
		t.Error("a second load while the first is under way was taken")
	}
	wake.reply <- nil
	r.until("awake", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Awake })
	r.until("the load ended", func(Snapshot) bool { return !r.m.loading.Load() })
	if !r.m.Load(context.Background(), "ui", 0) {
		t.Error("a load after the last one ended was refused")
	}
}
