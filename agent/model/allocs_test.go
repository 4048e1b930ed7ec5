package model

import (
	"context"
	"testing"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
	"github.com/napd/napd/supervisor"
)

// maxAdmitAllocs bounds the allocations of one request's admission and
// end on an awake model below its concurrency limit: the lease, the
// waiter, the ticket and the closures run under the loop's lock (20 when
// written, the test's own sync included). It is a regression guard for
// the proxy hot path (docs/bench.md), not a timing: a change that adds
// allocations per request has to raise it on purpose.
const maxAdmitAllocs = 24

func TestAdmitAllocs(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.MaxConcurrency = 4 })
	ctx := context.Background()
	a := gateway.Admission{Model: "m", Kind: request.Chat}
	round := func() {
		tk, err := r.m.Admit(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(gateway.Outcome{})
	}
	round() // the first grant allocates the model's lasting state
	r.sync()
	n := testing.AllocsPerRun(200, func() {
		round()
		r.sync() // the loop's share of the end is counted in this run
	})
	if n > maxAdmitAllocs {
		t.Errorf("%.1f allocations per admitted request, want ≤ %d", n, maxAdmitAllocs)
	}
	t.Logf("%.1f allocations per admitted request", n)
}
