package model

import (
	"context"
	"testing"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
	"github.com/napd/napd/supervisor"
)

// maxAdmitAllocs bounds the allocations of one request's admission and
// end on an awake model below its concurrency limit: the waiter (which is
// its ticket), the ticket's Done and Reroute, and the two snapshots
// published, at its grant and at its end (5 when written; the lease's
// record is reused). It is a regression guard for the proxy hot path
// (docs/bench.md), not a timing: a change that adds allocations per
// request has to raise it on purpose.
const maxAdmitAllocs = 6

func TestAdmitAllocs(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.MaxConcurrency = 4 })
	ctx := context.Background()
	a := lease.Request{Model: "m", Kind: request.Chat}
	round := func() {
		tk, err := r.m.Admit(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(gateway.Outcome{})
	}
	round() // the first grant allocates the model's lasting state
	r.sync()
	// Nothing is posted to the loop meanwhile, so the admission and the end
	// run inline on this goroutine: the run counts all of their work and
	// nothing of the test's.
	n := testing.AllocsPerRun(200, round)
	r.sync()
	if n > maxAdmitAllocs {
		t.Errorf("%.1f allocations per admitted request, want ≤ %d", n, maxAdmitAllocs)
	}
	if s := r.m.Snapshot(); s.Active != 0 || s.QueueDepth != 0 {
		t.Errorf("after the rounds: %d active, %d queued, want none", s.Active, s.QueueDepth)
	}
	t.Logf("%.1f allocations per admitted request", n)
}

// BenchmarkAdmit is one request's admission and end on an awake model
// below its concurrency limit: the inline fast path.
func BenchmarkAdmit(b *testing.B) {
	r := newRig(b, supervisor.Awake, func(c *config.Model) { c.MaxConcurrency = 4 })
	ctx := context.Background()
	a := lease.Request{Model: "m", Kind: request.Chat}
	r.sync()
	b.ReportAllocs()
	for b.Loop() {
		tk, err := r.m.Admit(ctx, a)
		if err != nil {
			b.Fatal(err)
		}
		tk.Done(gateway.Outcome{})
	}
}
