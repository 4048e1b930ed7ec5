package model

import (
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// LoadState maps a model's lifecycle onto the router API's vocabulary:
// serving (awake, draining, unsupported) is loaded; waking, also while it
// waits for GPU memory, is loading; asleep in a strategy that keeps the
// engine (vLLM's and SGLang's sleep modes, llama.cpp's own) is sleeping;
// stopped, failed or not yet verified is unloaded.
func (s Snapshot) LoadState() gateway.LoadState {
	switch st := s.Lifecycle.State; {
	case st.Serving() || st == lifecycle.Draining:
		return gateway.LoadLoaded
	case st == lifecycle.Waking:
		return gateway.LoadLoading
	case st == lifecycle.Sleeping && supervisor.KeepsEngine(s.Slept):
		return gateway.LoadSleeping
	}
	return gateway.LoadUnloaded
}

// RouterInfo fills the router API's part of a model's listing, and the
// load's progress while it wakes: the fraction of its weights read (0 to
// 1) for /models and /models/sse when napd knows their size, the whole
// measure for /v1/models.
func (s Snapshot) RouterInfo(info *gateway.ModelInfo) {
	info.Load = s.LoadState()
	info.Failed = s.Lifecycle.State == lifecycle.Failed
	info.Args = s.Spec.Command
	if l := s.Load; l != nil {
		info.Loading = l
		if l.HaveFraction {
			info.Progress = &l.Fraction
		}
	}
}
