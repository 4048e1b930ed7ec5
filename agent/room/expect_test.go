package room

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
)

// Each round tells a waiting model when its memory is expected to be
// free (for overflow_when = "late"): a busy holder's yield_after after
// the oldest request plus its typical request; once it yields, a typical
// request from now.
func TestDesk_TellsWhenRoomIsExpected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		var mu sync.Mutex
		told := map[string]time.Time{}
		r.desk.d.Expect = func(name string, by time.Time) {
			mu.Lock()
			defer mu.Unlock()
			told[name] = by
		}
		expected := func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return told["w"]
		}
		h := r.add("h", 20*GiB, lifecycle.Awake)
		h.set(func(s *model.Snapshot) { s.Learned = planner.Learned{Request: 2 * time.Second} })
		r.hold("h", 0, 20*GiB)
		r.setLeases("h", 1)
		r.setEngine("h", planner.EngineBusy)
		w := r.add("w", 16*GiB, lifecycle.Sleeping)
		r.run()
		r.wake(w, t0)
		synctest.Wait()
		if got, want := expected(), t0.Add(32*time.Second); !got.Equal(want) {
			t.Fatalf("told %s, want yield_after (30s) and a typical request (2s) after the oldest request", got.Sub(t0))
		}
		r.advance(31 * time.Second) // h yields at 30s and still works
		if got, want := expected(), r.clock.Now().Add(2*time.Second); !got.Equal(want) {
			t.Errorf("while h yields: told %s, want a typical request from now (%s)", got.Sub(t0), want.Sub(t0))
		}
	})
}
