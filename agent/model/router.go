package model

import (
	"context"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
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

// AdmitOnce is an arrival with no request behind it (napctl wake, a
// router API load, a warm wake): it holds a lease while the model wakes,
// so the planner leaves it alone, and ends it once admitted.
func (m *Model) AdmitOnce(ctx context.Context, client string) error {
	t, err := m.Admit(ctx, lease.Request{Model: m.Name(), Client: client, Kind: request.Other})
	if err == nil {
		t.Done(gateway.Outcome{})
	}
	return err
}

// Load is the router API's load (POST /models/load): AdmitOnce off the
// caller, bounded like a request by timeout (0: none) and by ctx (napd's
// lifetime). A failed model is reset first: a load is the operator's new
// try. It reports false, and does nothing, while a load of m is under
// way.
func (m *Model) Load(ctx context.Context, client string, timeout time.Duration) bool {
	if !m.loading.CompareAndSwap(false, true) {
		return false
	}
	if m.Snapshot().Lifecycle.State == lifecycle.Failed {
		m.Reset()
	}
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	go func() {
		defer m.loading.Store(false)
		defer cancel()
		if err := m.AdmitOnce(ctx, client); err != nil {
			m.log.Info("load did not wake the model", "client", client, "err", err)
		}
	}()
	return true
}
