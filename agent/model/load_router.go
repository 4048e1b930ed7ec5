package model

import (
	"context"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
)

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
