package room

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/agent/priority"
)

// The desk hands the planner the classes: a holder serving only batch
// yields to an interactive waiter after [policy] priority_yield_after's
// batch (5 s), not after its yield_after (30 s), and the waiter is told
// the classes.
func TestDesk_YieldsPerClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.cfg.Policy.PriorityYieldAfter = map[string]time.Duration{"batch": 5 * time.Second}
		h := r.add("h", 20*GiB, lifecycle.Awake)
		r.hold("h", 0, 20*GiB)
		r.setLeases("h", 2)
		r.setEngine("h", planner.EngineBusy)
		h.set(func(s *model.Snapshot) { s.Serving, s.Recent = 3, 3 })
		w := r.add("w", 16*GiB, lifecycle.Sleeping)
		r.run()
		w.set(func(s *model.Snapshot) { s.Queued = new(priority.Oldest); s.Queued.Note(1, t0) })
		ww := r.wake(w, t0)
		synctest.Wait()
		if got := ww.lastTold(); !strings.Contains(got, "busy h (batch, 20.0 GiB; yields in 5s)") {
			t.Errorf("w was told %q", got)
		}
		r.advance(4 * time.Second)
		if got := h.asked(); len(got) != 0 {
			t.Fatalf("h asked to sleep before batch's priority_yield_after: %+v", got)
		}
		r.advance(time.Second)
		if got := h.asked(); len(got) != 1 || got[0].Cause != string(planner.ReasonYield) {
			t.Fatalf("at 5 s h was asked %+v, want one yield", got)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if n := len(r.events); n == 0 || !strings.Contains(r.events[n-1].Reason, "yield to w (interactive), which waited 5s for its memory; h serves only batch (priority_yield_after batch = 5s)") {
			t.Errorf("the decision event: %+v", r.events)
		}
	})
}
