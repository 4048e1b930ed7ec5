package planner

import (
	"testing"
	"time"

	"github.com/napd/napd/agent/lifecycle"
)

// A waiting turn says when its memory is expected to be free, from the
// holders' learned requests and yields; never when a holder's end cannot
// be told.
func TestPlanRoom_ReadyBy(t *testing.T) {
	a20 := holds(map[int]int64{0: 20 * GiB})
	a10, c10 := holds(map[int]int64{0: 10 * GiB}), holds(map[int]int64{0: 10 * GiB})
	tests := []struct {
		name   string
		in     Input
		waiter Waiter
		want   time.Duration // from now; -1: unknown
	}{
		{"an idle holder frees its memory now",
			box1(waiting("b", 20*GiB), model("a", a20, idleFor(time.Minute))), since("b", time.Second), 0},
		{"a draining holder's memory is coming back now",
			box1(waiting("b", 20*GiB), model("a", a20, state(lifecycle.Draining))), since("b", time.Second), 0},
		{"a busy holder yields at yield_after, then finishes a typical request",
			box1(waiting("b", 20*GiB), model("a", a20, leases(1), yieldAfter(30*time.Second), learned(0, 2*time.Second))),
			since("b", 10*time.Second), 22 * time.Second},
		{"sooner for a deadline: by the waiter's wake and the holder's request",
			box1(waiting("b", 20*GiB, learned(5*time.Second, 0)),
				model("a", a20, leases(1), yieldAfter(30*time.Second), learned(0, 3*time.Second))),
			withDeadline(since("b", 2*time.Second), 18*time.Second), 13 * time.Second},
		{"a yielding holder finishes a typical request from now",
			box1(waiting("b", 20*GiB), model("a", a20, leases(1), yieldAfter(30*time.Second), learned(0, 4*time.Second))),
			since("b", time.Minute), 4 * time.Second},
		{"the latest of several holders",
			box1(waiting("b", 20*GiB), model("a", a10, leases(1), yieldAfter(time.Minute), learned(0, time.Second)),
				model("c", c10, leases(1), yieldAfter(30*time.Second), learned(0, time.Second))),
			since("b", 10*time.Second), 51 * time.Second},
		{"work napd did not admit: unknown",
			box1(waiting("b", 20*GiB), model("a", a20, engine(EngineBusy))), since("b", time.Second), -1},
		{"a holder loading for its own requests: unknown",
			box1(waiting("b", 20*GiB), model("a", a20, state(lifecycle.Waking))), since("b", time.Second), -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			turn, ok := PlanRoom(tc.in, []Waiter{tc.waiter}).Turn("b")
			if !ok || turn.Verdict != RoomWait {
				t.Fatalf("turn %+v, want b waiting", turn)
			}
			switch {
			case tc.want < 0 && !turn.ReadyBy.IsZero():
				t.Errorf("ReadyBy %s, want unknown", turn.ReadyBy.Sub(now))
			case tc.want >= 0 && !turn.ReadyBy.Equal(now.Add(tc.want)):
				t.Errorf("ReadyBy %v from now, want %s", turn.ReadyBy.Sub(now), tc.want)
			}
		})
	}
}
