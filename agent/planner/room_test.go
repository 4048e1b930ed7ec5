package planner

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/sleepmode"
)

func yieldAfter(d time.Duration) opt { return func(m *Model) { m.YieldAfter = d } }
func learned(wake, req time.Duration) opt {
	return func(m *Model) { m.Learned = Learned{Wake: wake, Request: req} }
}

// waiting is a sleeping model of size b whose request waits for room.
func waiting(name string, b int64, opts ...opt) Model {
	return model(name, append([]opt{state(lifecycle.Waking), footprint(b)}, opts...)...)
}

// since is a waiter whose oldest request arrived ago before now.
func since(name string, ago time.Duration) Waiter {
	return Waiter{Model: name, Oldest: now.Add(-ago), Requests: 1}
}

func withDeadline(w Waiter, in time.Duration) Waiter {
	w.Deadline = now.Add(in)
	return w
}

// box1 is one 24 GiB GPU (1 GiB reserve) holding exactly the given models.
func box1(models ...Model) Input {
	in := roomy(models...)
	var used int64
	for _, m := range models {
		used += m.GPUBytes[0]
	}
	in.GPUs = []GPU{{Index: 0, Total: 24 * GiB, Free: 24*GiB - used}}
	return in
}

type turnWant struct {
	verdict Verdict
	holders string // HolderList, "" = not checked
	message string // substring, "" = not checked
}

func TestPlanRoom_Rules(t *testing.T) {
	a20 := holds(map[int]int64{0: 20 * GiB})
	tests := []struct {
		name    string
		in      Input
		waiters []Waiter
		turns   map[string]turnWant
		sleeps  []want // make-room and yield decisions
		recheck time.Duration
		retry   time.Duration // the refused turn's Retry-After
	}{
		{
			name:    "fits in free memory minus the reserve: wake now",
			in:      box1(waiting("b", 20*GiB), model("a", holds(map[int]int64{0: 2 * GiB}))),
			waiters: []Waiter{since("b", time.Second)},
			turns:   map[string]turnWant{"b": {verdict: RoomFits}},
		},
		{
			name:    "demand overrides anti-flap: an idle holder used a second ago sleeps at once",
			in:      box1(waiting("b", 20*GiB), model("a", a20, idleFor(time.Second))),
			waiters: []Waiter{since("b", 0)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait, holders: "idle a (20.0 GiB)"}},
			sleeps:  []want{{"a", ActionSleep, "stop", ReasonMakeRoom}},
		},
		{
			name: "least memory moved: the one holder that suffices, not the older small one too",
			in: box1(waiting("b", 10*GiB),
				model("old-small", holds(map[int]int64{0: 5 * GiB}), idleFor(time.Hour)),
				model("newer-big", holds(map[int]int64{0: 15 * GiB}), idleFor(time.Minute))),
			waiters: []Waiter{since("b", 0)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait, holders: "idle newer-big (15.0 GiB)"}},
			sleeps:  []want{{"newer-big", ActionSleep, "stop", ReasonMakeRoom}},
		},
		{
			name: "least recently used first among holders that each suffice",
			in: box1(waiting("b", 10*GiB),
				model("mru", holds(map[int]int64{0: 11 * GiB}), idleFor(time.Second)),
				model("lru", holds(map[int]int64{0: 11 * GiB}), idleFor(time.Hour))),
			waiters: []Waiter{since("b", 0)},
			sleeps:  []want{{"lru", ActionSleep, "stop", ReasonMakeRoom}},
		},
		{
			name: "an idle holder is taken before a busy one",
			in: box1(waiting("b", 10*GiB),
				model("busy", leases(2), holds(map[int]int64{0: 11 * GiB}), idleFor(time.Hour)),
				model("idle", holds(map[int]int64{0: 11 * GiB}), idleFor(time.Second))),
			waiters: []Waiter{since("b", time.Hour)},
			sleeps:  []want{{"idle", ActionSleep, "stop", ReasonMakeRoom}},
		},
		{
			name:    "a busy holder keeps admitting until yield_after after the oldest waiting request",
			in:      box1(waiting("b", 20*GiB), model("a", a20, leases(1), yieldAfter(30*time.Second))),
			waiters: []Waiter{since("b", 10*time.Second)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait, holders: "busy a (20.0 GiB)", message: "b (20.0 GiB) waits for GPU memory (17.0 GiB on GPU 0 short) held by busy a"}},
			recheck: 20 * time.Second,
		},
		{
			name:    "then it yields: stops admitting, finishes and sleeps",
			in:      box1(waiting("b", 20*GiB), model("a", a20, leases(1), yieldAfter(30*time.Second))),
			waiters: []Waiter{since("b", 30*time.Second)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait, holders: "yielding a (20.0 GiB)"}},
			sleeps:  []want{{"a", ActionSleep, "stop", ReasonYield}},
		},
		{
			name: "a deadline that would pass first brings the yield forward by the wake and a typical request",
			in: box1(waiting("b", 20*GiB, learned(5*time.Second, 0)),
				model("a", a20, leases(1), yieldAfter(30*time.Second), learned(0, 3*time.Second))),
			waiters: []Waiter{withDeadline(since("b", 2*time.Second), 18*time.Second)},
			recheck: 10 * time.Second, // deadline 18s - wake 5s - request 3s
		},
		{
			name:    "work napd did not admit is waited for, never told to yield",
			in:      box1(waiting("b", 20*GiB), model("a", a20, engine(EngineBusy))),
			waiters: []Waiter{since("b", time.Hour)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait, holders: "busy a (20.0 GiB)"}},
		},
		{
			name: "memory draining back counts first: nothing more is put to sleep",
			in: box1(waiting("b", 20*GiB), model("going", state(lifecycle.Draining), a20),
				model("idle", holds(map[int]int64{0: 2 * GiB}))),
			waiters: []Waiter{since("b", 0)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait, holders: "draining going (20.0 GiB)"}},
		},
		{
			name:    "a pinned holder: refused at once, naming it",
			in:      box1(waiting("b", 20*GiB, learned(4*time.Second, 0)), model("pin", pinned, a20, learned(0, 2*time.Second))),
			waiters: []Waiter{since("b", 0)},
			turns: map[string]turnWant{"b": {verdict: RoomRefused, holders: "pinned pin (20.0 GiB)",
				message: "cannot fit b (20.0 GiB) on GPU 0 (24.0 GiB, gpu_reserve 1.0 GiB): held by pinned pin (20.0 GiB), which waiting cannot free"}},
			retry: 6 * time.Second,
		},
		{
			name:    "a holder whose idleness cannot be proven: refused",
			in:      box1(waiting("b", 20*GiB), model("blind", engine(EngineNone), a20)),
			waiters: []Waiter{since("b", 0)},
			turns:   map[string]turnWant{"b": {verdict: RoomRefused, holders: "untracked blind (20.0 GiB)"}},
			retry:   unknownWake,
		},
		{
			name:    "allow_untracked_unload makes it an idle holder",
			in:      box1(waiting("b", 20*GiB), model("blind", engine(EngineNone), untrackedAllowed, a20)),
			waiters: []Waiter{since("b", 0)},
			sleeps:  []want{{"blind", ActionSleep, "stop", ReasonMakeRoom}},
		},
		{
			name: "processes napd does not manage: refused",
			in: func() Input {
				in := box1(waiting("b", 20*GiB), model("a", holds(map[int]int64{0: 2 * GiB})))
				in.GPUs[0].Free -= 10 * GiB
				return in
			}(),
			waiters: []Waiter{since("b", 0)},
			turns:   map[string]turnWant{"b": {verdict: RoomRefused, holders: "other processes (10.0 GiB)"}},
		},
		{
			name:    "larger than the GPU after the reserve: refused",
			in:      box1(waiting("b", 24*GiB)),
			waiters: []Waiter{since("b", 0)},
			turns:   map[string]turnWant{"b": {verdict: RoomRefused, message: "larger than the GPU after the reserve"}},
		},
		{
			name: "fair turns: the oldest waiting request goes first and the holder is promised to it",
			in: box1(waiting("b", 20*GiB), waiting("c", 20*GiB),
				model("a", a20, leases(1), yieldAfter(30*time.Second))),
			waiters: []Waiter{since("c", 40*time.Second), since("b", 50*time.Second)},
			turns: map[string]turnWant{
				"b": {verdict: RoomWait, holders: "yielding a (20.0 GiB)"},
				"c": {verdict: RoomWait, holders: "ahead b (20.0 GiB)"},
			},
			sleeps: []want{{"a", ActionSleep, "stop", ReasonYield}},
		},
		{
			// A busy holder yielded (its engine stopped) and wakes again for
			// the requests queued during the yield; the reading, taken as
			// the engine exited, still shows its memory.
			name: "a stopped engine's memory still read is not its own: the holder that yielded waits its turn",
			in: box1(waiting("b", 16*GiB),
				waiting("a", 16*GiB, holds(map[int]int64{0: 16 * GiB}), func(m *Model) { m.Slept = sleepmode.Stop })),
			waiters: []Waiter{since("b", 3*time.Second), since("a", 0)},
			turns: map[string]turnWant{
				"b": {verdict: RoomWait},
				"a": {verdict: RoomWait, holders: "ahead b (16.0 GiB)"},
			},
		},
		{
			name: "free memory is promised to the waiter ahead, not taken by a later one",
			in: box1(waiting("big", 22*GiB), waiting("small", 4*GiB),
				model("a", holds(map[int]int64{0: 18 * GiB}), leases(1), yieldAfter(time.Minute))),
			waiters: []Waiter{since("small", time.Second), since("big", 2*time.Second)},
			turns: map[string]turnWant{
				"big":   {verdict: RoomWait, holders: "busy a (18.0 GiB)"},
				"small": {verdict: RoomWait, holders: "ahead big (22.0 GiB)"},
			},
			recheck: 58 * time.Second,
		},
		{
			name: "a later waiter on another GPU does not wait for the first",
			in: func() Input {
				in := box1(waiting("b", 20*GiB), waiting("c", 20*GiB, onGPUs(1)), model("a", a20, leases(1), yieldAfter(time.Minute)))
				in.GPUs = append(in.GPUs, GPU{Index: 1, Total: 24 * GiB, Free: 24 * GiB})
				return in
			}(),
			waiters: []Waiter{since("b", 2*time.Second), since("c", time.Second)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait}, "c": {verdict: RoomFits}},
			recheck: 58 * time.Second,
		},
		{
			name: "an expired waiter takes nothing; the next one gets the memory",
			in: box1(waiting("b", 20*GiB), waiting("c", 20*GiB),
				model("a", a20)),
			waiters: []Waiter{withDeadline(since("b", time.Minute), 0), since("c", time.Second)},
			turns:   map[string]turnWant{"b": {verdict: RoomExpired}, "c": {verdict: RoomWait, holders: "idle a (20.0 GiB)"}},
			sleeps:  []want{{"a", ActionSleep, "stop", ReasonMakeRoom}},
		},
		{
			name:    "a model loading reserves what it still has to load",
			in:      box1(waiting("b", 20*GiB), model("loading", state(lifecycle.Waking), footprint(20*GiB))),
			waiters: []Waiter{since("b", time.Second)},
			turns:   map[string]turnWant{"b": {verdict: RoomWait, holders: "waking loading (20.0 GiB)"}},
		},
		{
			name: "tensor parallel: holders on each GPU it is short on",
			in: func() Input {
				in := box1(waiting("tp", 40*GiB, onGPUs(0, 1)), model("a", a20), model("c", holds(map[int]int64{1: 20 * GiB})))
				in.GPUs = []GPU{{Index: 0, Total: 24 * GiB, Free: 4 * GiB}, {Index: 1, Total: 24 * GiB, Free: 4 * GiB}}
				return in
			}(),
			waiters: []Waiter{since("tp", 0)},
			sleeps:  []want{{"a", ActionSleep, "stop", ReasonMakeRoom}, {"c", ActionSleep, "stop", ReasonMakeRoom}},
		},
		{
			name:    "memory its own sleeping engine holds need not be freed again",
			in:      box1(waiting("l1", 20*GiB, sleep(sleepmode.VLLML1), holds(map[int]int64{0: 2 * GiB}))),
			waiters: []Waiter{since("l1", 0)},
			turns:   map[string]turnWant{"l1": {verdict: RoomFits}},
		},
		{
			name:    "an unknown footprint is not checked",
			in:      box1(model("new", state(lifecycle.Waking)), model("a", a20, leases(1))),
			waiters: []Waiter{since("new", 0)},
			turns:   map[string]turnWant{"new": {verdict: RoomFits, message: "footprint or GPUs unknown"}},
		},
		{
			name:    "a GPU without a memory reading is not checked",
			in:      box1(waiting("x", 99*GiB, onGPUs(3))),
			waiters: []Waiter{since("x", 0)},
			turns:   map[string]turnWant{"x": {verdict: RoomFits}},
		},
		{
			name: "under host pressure an idle vllm-l1 holder is stopped, not parked in host memory",
			in: func() Input {
				in := box1(waiting("b", 20*GiB), model("l1", sleep(sleepmode.VLLML1), a20))
				in.Host.MemAvailable = GiB
				return in
			}(),
			waiters: []Waiter{since("b", 0)},
			sleeps:  []want{{"l1", ActionStop, "stop", ReasonMakeRoom}},
		},
		{
			name:    "an unknown waiter is refused",
			in:      box1(),
			waiters: []Waiter{since("ghost", 0)},
			turns:   map[string]turnWant{"ghost": {verdict: RoomRefused, message: `unknown model "ghost"`}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PlanRoom(tt.in, tt.waiters)
			for name, w := range tt.turns {
				turn, ok := got.Turn(name)
				if !ok {
					t.Fatalf("no turn for %s", name)
				}
				if turn.Verdict != w.verdict {
					t.Errorf("%s: verdict = %v (%s), want %v", name, turn.Verdict, turn.Message, w.verdict)
				}
				if w.holders != "" && HolderList(turn.Holders) != w.holders {
					t.Errorf("%s: holders = %q, want %q", name, HolderList(turn.Holders), w.holders)
				}
				if w.message != "" && !strings.Contains(turn.Message, w.message) {
					t.Errorf("%s: message = %q\nwant it to contain %q", name, turn.Message, w.message)
				}
				if turn.Verdict == RoomRefused && tt.retry != 0 && turn.RetryAfter != tt.retry {
					t.Errorf("%s: Retry-After = %s, want %s", name, turn.RetryAfter, tt.retry)
				}
			}
			if s := summary(got.Sleeps); !reflect.DeepEqual(s, tt.sleeps) {
				t.Errorf("sleeps = %v, want %v", s, tt.sleeps)
			}
			var recheck time.Duration
			if !got.Recheck.IsZero() {
				recheck = got.Recheck.Sub(now)
			}
			if recheck != tt.recheck {
				t.Errorf("recheck in %s, want %s", recheck, tt.recheck)
			}
		})
	}
}

// Turns come out oldest first whatever order the waiters come in.
func TestPlanRoom_TurnsInOrderOfTheOldestRequest(t *testing.T) {
	in := box1(waiting("x", GiB), waiting("y", GiB), waiting("z", GiB))
	got := PlanRoom(in, []Waiter{since("y", 2*time.Second), since("z", 3*time.Second), since("x", time.Second)})
	var order []string
	for _, tu := range got.Turns {
		order = append(order, tu.Model)
	}
	if !reflect.DeepEqual(order, []string{"z", "y", "x"}) {
		t.Fatalf("turns = %v", order)
	}
}

// A yield's message says who yields to whom and why, with the figures.
func TestPlanRoom_YieldMessage(t *testing.T) {
	in := box1(waiting("b", 20*GiB), model("a", holds(map[int]int64{0: 20 * GiB}), leases(3), yieldAfter(30*time.Second)))
	got := PlanRoom(in, []Waiter{since("b", 31*time.Second)})
	if len(got.Sleeps) != 1 {
		t.Fatalf("sleeps = %+v", got.Sleeps)
	}
	want := "sleep a (stop): yield to b, which waited 31s for its memory (yield_after 30s); frees 20.0 GiB on GPU 0; 3 in flight"
	if got.Sleeps[0].Message != want {
		t.Errorf("message = %q\nwant      %q", got.Sleeps[0].Message, want)
	}
}

// The device's free figure and its process list are read a moment apart: a
// model that just started loading may show in the list and not yet in the
// free figure. Its memory counts as used.
func TestPlanRoom_ProcessesCountEvenIfFreeLags(t *testing.T) {
	in := box1(waiting("b", 16*GiB), model("a", state(lifecycle.Waking), footprint(16*GiB), holds(map[int]int64{0: 16 * GiB})))
	in.GPUs[0].Free = 24 * GiB // read before a's engine started
	got := PlanRoom(in, []Waiter{since("b", 0)})
	if tu, _ := got.Turn("b"); tu.Verdict != RoomWait {
		t.Fatalf("b: %v (%s), want to wait for a", tu.Verdict, tu.Message)
	}
}

// PlanRoom reads its input and changes nothing in it.
func TestPlanRoom_DoesNotModifyInput(t *testing.T) {
	in := box1(waiting("b", 20*GiB), model("z", holds(map[int]int64{0: 10 * GiB}), idleFor(time.Hour)),
		model("a", holds(map[int]int64{0: 10 * GiB}), leases(2)))
	before := fmt.Sprintf("%+v", in)
	PlanRoom(in, []Waiter{since("b", time.Hour)})
	if after := fmt.Sprintf("%+v", in); after != before {
		t.Errorf("PlanRoom changed its input:\n%s\n%s", before, after)
	}
}
