package planner

import (
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/priority"
)

const (
	interactive priority.Class = 1
	dflt        priority.Class = 2
	batch       priority.Class = 3
)

func serving(c priority.Class) opt { return func(m *Model) { m.Serving, m.Recent = c, c } }
func recent(c priority.Class) opt  { return func(m *Model) { m.Recent = c } }

// classed adds the classes to an input: priority_age 1m, and batch
// yields after 5 s to a higher class.
func classed(in Input) Input {
	in.Classes, in.PriorityAge = priority.DefaultClasses, time.Minute
	in.ClassYieldAfter = map[priority.Class]time.Duration{batch: 5 * time.Second}
	return in
}

// queuedAs is a waiter whose requests of class c arrived ago before now
// (each pair: class, ago).
func queuedAs(name string, pairs ...any) Waiter {
	w := Waiter{Model: name, Requests: len(pairs) / 2, Queued: new(priority.Oldest)}
	for i := 0; i < len(pairs); i += 2 {
		at := now.Add(-pairs[i+1].(time.Duration))
		w.Queued.Note(pairs[i].(priority.Class), at)
		if w.Oldest.IsZero() || at.Before(w.Oldest) {
			w.Oldest = at
		}
	}
	return w
}

// A waiter of a higher class has its turn before older waiters of lower
// classes; one aged to the higher class by priority_age keeps its place
// by age.
func TestPlanRoom_HigherClassTakesItsTurnFirst(t *testing.T) {
	for _, tc := range []struct {
		name       string
		older, new Waiter
		first      string
	}{
		{"interactive before an older batch", queuedAs("old", batch, 30*time.Second), queuedAs("new", interactive, time.Second), "new"},
		{"same class: by age", queuedAs("old", batch, 30*time.Second), queuedAs("new", batch, time.Second), "old"},
		{"a batch waiter aged to interactive keeps its turn", queuedAs("old", batch, 2*time.Minute), queuedAs("new", interactive, time.Second), "old"},
		{"its best class counts", queuedAs("old", batch, 30*time.Second, interactive, time.Second), queuedAs("new", dflt, 10*time.Second), "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 24 GiB, room for one of them: the first takes it, the other
			// waits for it (ahead).
			in := classed(box1(waiting("old", 16*GiB), waiting("new", 16*GiB)))
			plan := PlanRoom(in, []Waiter{tc.older, tc.new})
			if plan.Turns[0].Model != tc.first || plan.Turns[0].Verdict != RoomFits {
				t.Errorf("first turn %s (%v), want %s to fit", plan.Turns[0].Model, plan.Turns[0].Verdict, tc.first)
			}
			if plan.Turns[1].Verdict != RoomWait || !strings.Contains(HolderList(plan.Turns[1].Holders), "ahead "+tc.first) {
				t.Errorf("second turn %+v", plan.Turns[1])
			}
		})
	}
}

// Yields per class, on a hand-advanced clock: a busy holder whose
// requests in flight are all of a lower class than the waiter's yields
// after its class's priority_yield_after (batch: 5 s here); one serving
// the waiter's class after its own yield_after (30 s); one serving a
// higher class not at all, until the waiter has aged to its class. The
// messages name the classes where they decide.
func TestPlanRoom_YieldPerClass(t *testing.T) {
	a16 := holds(map[int]int64{0: 16 * GiB})
	for _, tc := range []struct {
		name   string
		holder priority.Class
		waiter Waiter
		yields bool
		note   string // the holder's part of the wait, "" = not checked
		why    string // the yield decision's message, "" = not checked
	}{
		{"batch holder, interactive waiter, 4s", batch, queuedAs("b", interactive, 4*time.Second), false,
			"busy a (batch, 16.0 GiB; yields in 1s)", ""},
		{"batch holder, interactive waiter, 5s", batch, queuedAs("b", interactive, 5*time.Second), true,
			"yielding a (batch, 16.0 GiB)", "yield to b (interactive), which waited 5s for its memory; a serves only batch (priority_yield_after batch = 5s)"},
		{"default holder, interactive waiter: default is not in priority_yield_after", dflt, queuedAs("b", interactive, 29*time.Second), false,
			"busy a (default, 16.0 GiB; yields in 1s)", ""},
		{"default holder, interactive waiter, 30s", dflt, queuedAs("b", interactive, 30*time.Second), true, "", "(yield_after 30s)"},
		{"same class: yield_after", batch, queuedAs("b", batch, 29*time.Second), false, "busy a (16.0 GiB)", ""},
		{"same class, 30s", batch, queuedAs("b", batch, 30*time.Second), true,
			"yielding a (16.0 GiB)", "yield to b, which waited 30s for its memory (yield_after 30s)"},
		{"interactive never yields to batch", interactive, queuedAs("b", batch, 59*time.Second), false,
			"busy a (interactive, 16.0 GiB; does not yield to batch)", ""},
		{"until batch has aged to interactive (2 × priority_age)", interactive, queuedAs("b", batch, 2*time.Minute), true, "", "(yield_after 30s)"},
		{"nor to default", interactive, queuedAs("b", dflt, 59*time.Second), false, "does not yield to default", ""},
		{"the earliest of the waiter's classes", batch, queuedAs("b", batch, 10*time.Second, interactive, 5*time.Second), true, "", "priority_yield_after batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := classed(box1(waiting("b", 16*GiB), model("a", a16, leases(2), serving(tc.holder), yieldAfter(30*time.Second))))
			plan := PlanRoom(in, []Waiter{tc.waiter})
			turn := plan.Turns[0]
			if yielded := len(plan.Sleeps) == 1 && plan.Sleeps[0].Reason == ReasonYield; yielded != tc.yields {
				t.Errorf("yields %v, want %v: %s", yielded, tc.yields, turn.Message)
			}
			if tc.note != "" && !strings.Contains(turn.Message, tc.note) {
				t.Errorf("message %q\nwant it to contain %q", turn.Message, tc.note)
			}
			if tc.why != "" && (len(plan.Sleeps) != 1 || !strings.Contains(plan.Sleeps[0].Message, tc.why)) {
				t.Errorf("decisions %+v\nwant one containing %q", plan.Sleeps, tc.why)
			}
		})
	}
}

// The waiter is named with its class where the holder's differs:
// "b (interactive, …) waits … held by busy a (batch, …; yields in 4s)".
func TestPlanRoom_ClassesInTheWaitMessage(t *testing.T) {
	in := classed(box1(waiting("b", 16*GiB), model("a", holds(map[int]int64{0: 16 * GiB}), leases(1), serving(batch))))
	turn := PlanRoom(in, []Waiter{queuedAs("b", interactive, time.Second)}).Turns[0]
	want := "b (interactive, 16.0 GiB) waits for GPU memory (9.0 GiB on GPU 0 short) held by busy a (batch, 16.0 GiB; yields in 4s)"
	if turn.Message != want {
		t.Errorf("message\n%q\nwant\n%q", turn.Message, want)
	}
	// A holder serving requests of no class counts as the lowest class.
	in = classed(box1(waiting("b", 16*GiB), model("a", holds(map[int]int64{0: 16 * GiB}), leases(1))))
	if plan := PlanRoom(in, []Waiter{queuedAs("b", interactive, 5*time.Second)}); len(plan.Sleeps) != 1 {
		t.Errorf("a holder of no class did not yield as batch: %s", plan.Turns[0].Message)
	}
}

// Eviction of idle models prefers those whose recent use was of the
// lowest class, then the least recently used: for a waiting model, and
// under GPU pressure.
func TestEvictionPrefersTheLowestRecentClass(t *testing.T) {
	a11 := holds(map[int]int64{0: 11 * GiB})
	in := classed(box1(waiting("w", 10*GiB),
		model("ide", a11, recent(interactive), idleFor(time.Hour)),
		model("nightly", a11, recent(batch), idleFor(time.Second))))
	plan := PlanRoom(in, []Waiter{queuedAs("w", dflt, time.Duration(0))})
	if s := summary(plan.Sleeps); len(s) != 1 || s[0].model != "nightly" {
		t.Errorf("for a waiter, put to sleep %v, want nightly (batch) though ide is the least recently used", s)
	}
	pressed := classed(gpuFree(roomy(
		model("ide", holds(map[int]int64{0: 10 * GiB}), recent(interactive), idleFor(10*time.Minute)),
		model("nightly", holds(map[int]int64{0: 10 * GiB}), recent(batch), idleFor(2*time.Minute)),
		model("unused", state(lifecycle.Sleeping))), 0, GiB/2))
	if s := summary(Plan(pressed).Decisions); len(s) != 1 || s[0].model != "nightly" || s[0].reason != ReasonGPUPressure {
		t.Errorf("under GPU pressure, put to sleep %v, want nightly (batch)", s)
	}
}
