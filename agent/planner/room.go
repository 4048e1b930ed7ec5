package planner

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/napd/napd/agent/lifecycle"
)

// Waiter is a model whose requests wait for GPU memory to wake.
type Waiter struct {
	Model string
	// Oldest is when its oldest waiting request arrived: turns go in this
	// order, and a busy holder's yield_after counts from it.
	Oldest time.Time
	// Deadline is that request's deadline; zero = none.
	Deadline time.Time
	// Requests is how many requests wait (for messages).
	Requests int
}

// Verdict is a waiter's outcome in one room plan.
type Verdict int

// Verdicts.
const (
	// RoomFits: the wake fits in free memory now; start it.
	RoomFits Verdict = iota
	// RoomWait: room can appear in time (idle holders put to sleep, busy
	// ones finishing or yielding, memory draining back, models ahead in
	// line); keep waiting and plan again.
	RoomWait
	// RoomRefused: room can never appear in time: the memory is held by
	// pinned models, by models whose idleness cannot be proven, by
	// processes napd does not manage, or the model is larger than its GPUs
	// after the reserve. Answer 503 with Message and RetryAfter.
	RoomRefused
	// RoomExpired: the oldest request's deadline has passed; the caller's
	// requests end with 504 on their own deadlines.
	RoomExpired
)

func (v Verdict) String() string {
	switch v {
	case RoomFits:
		return "fits"
	case RoomWait:
		return "wait"
	case RoomRefused:
		return "refused"
	}
	return "expired"
}

// Turn is one waiter's outcome, in the order of the turns.
type Turn struct {
	Model   string
	Verdict Verdict
	// Holders are the models the waiter waits for (RoomWait), or that hold
	// the memory it cannot get (RoomRefused), with what each holds.
	Holders []Holder
	// Message says it for a human, with the figures: why it waits and for
	// whom, or the 503's message.
	Message string
	// RetryAfter is the Retry-After of a RoomRefused 503: the waiter's
	// typical wake plus the holders' typical request time.
	RetryAfter time.Duration
	// ReadyBy (RoomWait) is when the memory is expected to be free: the
	// latest end among the holders, an idle or draining one's now, a busy
	// one's its yield plus its typical request (a yielding one's a
	// typical request from now). Zero when a holder's end cannot be told
	// (it is loading, busy with work napd did not admit, or ahead in
	// line).
	ReadyBy time.Time
}

// Holder is a model holding memory a waiter needs, and why it holds it.
// Model "" is memory of other processes (Label "").
type Holder struct {
	Model string
	Label Hold
	Bytes int64
}

// Hold is why a holder holds memory a waiter needs; its spelling is the
// word before the holder's name in messages ("busy a (20.0 GiB)").
type Hold string

// Holds.
const (
	HoldBusy      Hold = "busy"      // serving; yields after yield_after
	HoldIdle      Hold = "idle"      // put to sleep now for the waiter
	HoldYielding  Hold = "yielding"  // busy and asked to yield now
	HoldDraining  Hold = "draining"  // going to sleep: its memory is coming back
	HoldWaking    Hold = "waking"    // loading for its own requests
	HoldPinned    Hold = "pinned"    // never put to sleep by the planner
	HoldUntracked Hold = "untracked" // its idleness cannot be proven
	HoldSleeping  Hold = "sleeping"  // asleep in a strategy that keeps memory
	HoldAhead     Hold = "ahead"     // promised to a waiter ahead in line
)

// Freed reports a hold the plan ends for the waiter: the holder is asked
// to sleep for it (idle now, or yielding).
func (h Hold) Freed() bool { return h == HoldIdle || h == HoldYielding }

func (h Holder) String() string {
	name := "other processes"
	if h.Model != "" {
		name = string(h.Label) + " " + h.Model
	}
	return fmt.Sprintf("%s (%s)", name, gib(h.Bytes))
}

// HolderList renders holders for a message: "busy a (20.0 GiB), pinned b (2.0 GiB)".
func HolderList(hs []Holder) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = h.String()
	}
	return strings.Join(parts, ", ")
}

// RoomPlan is PlanRoom's answer.
type RoomPlan struct {
	// Turns has one entry per waiter, oldest waiting request first.
	Turns []Turn
	// Sleeps are the holders to put to sleep for the waiters: idle ones now
	// (ReasonMakeRoom; demand overrides the idle minimum), and busy ones
	// whose yield is due (ReasonYield): they stop admitting new requests,
	// which are queued, finish what is in flight and sleep.
	Sleeps []Decision
	// Recheck is when a yield falls due without new evidence; zero if none.
	Recheck time.Time
}

// Turn returns the named waiter's turn.
func (p RoomPlan) Turn(model string) (Turn, bool) {
	i := slices.IndexFunc(p.Turns, func(t Turn) bool { return t.Model == model })
	if i < 0 {
		return Turn{}, false
	}
	return p.Turns[i], true
}

// unknownWake stands in for a wake never measured when Retry-After is
// computed.
const unknownWake = 10 * time.Second

// PlanRoom plans GPU memory for every model waiting to wake, in the order
// of their oldest waiting request (fair turns):
//   - a waiter whose footprint fits in free memory minus gpu_reserve, after
//     what loading models and the waiters ahead of it take, wakes now;
//   - one that could never fit because pinned models, models whose idleness
//     cannot be proven, sleeping engines or other processes hold the rest,
//     or that is larger than its GPUs after the reserve, is refused;
//   - otherwise it waits. Memory draining back counts first; then idle,
//     unpinned holders are put to sleep at once (demand overrides the idle
//     minimum), least recently used first, keeping only those needed so
//     the least memory moves; then busy holders are chosen the same way,
//     and each keeps admitting until yield_after after the waiter's oldest
//     request (earlier if the waiter's deadline would pass otherwise), when
//     it yields.
//
// Memory free now, draining back or freed by chosen holders is promised to
// the first waiter that needs it: a later one does not take it, and a
// holder chosen for one waiter is not chosen again. Waiters whose oldest
// request's deadline passed are expired and take nothing.
func PlanRoom(in Input, waiters []Waiter) RoomPlan {
	p := newPlanner(&in)
	r := &roomPlanner{planner: p, waiting: make(map[string]bool), taken: make(map[string]bool),
		now: make(map[int]int64), coming: make(map[int]int64), ahead: make(map[string]bool)}
	for _, w := range waiters {
		r.waiting[w.Model] = true
	}
	r.start()
	order := slices.Clone(waiters)
	slices.SortStableFunc(order, func(a, b Waiter) int {
		if c := a.Oldest.Compare(b.Oldest); c != 0 {
			return c
		}
		return strings.Compare(a.Model, b.Model)
	})
	var plan RoomPlan
	for _, w := range order {
		t := r.turn(w, &plan)
		plan.Turns = append(plan.Turns, t)
		r.ahead[w.Model] = t.Verdict == RoomFits || t.Verdict == RoomWait
	}
	plan.Sleeps = p.decisions
	return plan
}

type roomPlanner struct {
	*planner
	waiting map[string]bool // models waiting for room (not loading)
	taken   map[string]bool // holders promised to an earlier waiter
	now     map[int]int64   // per GPU: free now, less the reserve and what is promised
	coming  map[int]int64   // per GPU: draining back, not yet promised
	ahead   map[string]bool // waiters whose turn came before
}

// start computes per GPU what is free now (less gpu_reserve and what
// models loading will take) and what is draining back. Memory the models'
// processes hold counts as used even if the device's free figure, read a
// moment apart from the process list, does not show it yet.
func (r *roomPlanner) start() {
	for _, g := range r.in.GPUs {
		free := g.Free
		held := int64(0)
		for _, m := range r.byLRU {
			held += m.GPUBytes[g.Index]
		}
		free = min(free, g.Total-held)
		avail := free - r.in.Pressure.GPUReserve
		var coming int64
		for _, m := range r.byLRU {
			switch {
			case m.State == lifecycle.Waking && !r.waiting[m.Name]:
				avail -= m.toLoad(g.Index)
			case m.State == lifecycle.Draining:
				coming += m.gpuShare(g.Index)
			}
		}
		r.now[g.Index], r.coming[g.Index] = avail, coming
	}
}

func (r *roomPlanner) turn(w Waiter, plan *RoomPlan) Turn {
	t := Turn{Model: w.Model}
	i := slices.IndexFunc(r.byLRU, func(m *Model) bool { return m.Name == w.Model })
	if i < 0 {
		t.Verdict, t.Message = RoomRefused, fmt.Sprintf("cannot plan wake of unknown model %q", w.Model)
		return t
	}
	m := r.byLRU[i]
	if !w.Deadline.IsZero() && !r.in.Now.Before(w.Deadline) {
		t.Verdict = RoomExpired
		t.Message = fmt.Sprintf("%s: the deadline of its oldest waiting request passed", m.Name)
		return t
	}
	if r.in.GPUUnknown && m.Footprint > 0 && len(m.GPUs) > 0 {
		t.Verdict = RoomRefused
		t.Message = fmt.Sprintf("cannot check that %s (%s) fits on GPU %s: %s", m.Name, gib(m.Footprint), joinInts(m.GPUs), r.in.GPUNote)
		t.RetryAfter = r.retryAfter(m, nil)
		return t
	}
	need := make(map[int]int64)
	if m.Footprint > 0 {
		for _, g := range m.GPUs {
			if _, ok := r.in.gpuOf(g); ok {
				need[g] = m.toLoad(g)
			}
		}
	}
	short := make(map[int]int64)
	for g, b := range need {
		if b > r.now[g] {
			short[g] = b - r.now[g]
		}
	}
	if len(short) == 0 {
		for g, b := range need {
			r.now[g] -= b
		}
		t.Verdict = RoomFits
		t.Message = fmt.Sprintf("%s (%s) fits", m.Name, gib(m.Footprint))
		if len(need) == 0 {
			t.Message = m.Name + ": footprint or GPUs unknown; fit not checked"
		}
		return t
	}
	if fixed, msg, ok := r.never(m, need); !ok {
		t.Verdict, t.Holders, t.Message = RoomRefused, fixed, msg
		t.RetryAfter = r.retryAfter(m, fixed)
		return t
	}

	// It waits: what is free now on the GPUs where it is short is promised
	// to it, so a later waiter does not take it.
	for g, b := range need {
		if short[g] > 0 {
			r.now[g] = 0
		} else {
			r.now[g] -= b
		}
	}
	left := maps.Clone(short)
	var holders []Holder
	for g := range short {
		if c := min(r.coming[g], left[g]); c > 0 {
			r.coming[g] -= c
			if left[g] -= c; left[g] <= 0 {
				delete(left, g)
			}
		}
	}
	for _, d := range r.byLRU {
		if d.State == lifecycle.Draining && d.shareOn(short) > 0 {
			holders = append(holders, Holder{d.Name, HoldDraining, d.shareOn(short)})
		}
	}
	idle := r.choose(m, left, func(c *Model) bool { return c.demandIdle() })
	busy := r.choose(m, left, func(c *Model) bool { return c.demandBusy() })
	for _, c := range idle {
		r.taken[c.Name] = true
		why := fmt.Sprintf("make room for %s (%s), waiting since %s; frees %s",
			m.Name, gib(m.Footprint), w.Oldest.Format(time.TimeOnly), c.freesOn(short))
		r.decide(c, ReasonMakeRoom, why)
		holders = append(holders, Holder{c.Name, HoldIdle, c.shareOn(short)})
	}
	readyBy, known := r.in.Now, len(left) == 0 // idle and draining holders free theirs now
	for _, c := range busy {
		r.taken[c.Name] = true
		label, at := HoldBusy, r.yieldAt(c, m, w)
		switch {
		case c.State == lifecycle.Waking:
			label, known = HoldWaking, false
		case c.Leases.Active == 0:
			// Work napd did not admit (the engine says busy): it cannot be
			// told to yield; its memory comes back when it ends.
			known = false
		case !r.in.Now.Before(at):
			label = HoldYielding
			why := fmt.Sprintf("yield to %s, which waited %s for its memory (yield_after %s); frees %s",
				m.Name, r.in.Now.Sub(w.Oldest).Round(time.Second), c.YieldAfter, c.freesOn(short))
			r.decide(c, ReasonYield, why)
			at = r.in.Now
		case plan.Recheck.IsZero() || at.Before(plan.Recheck):
			plan.Recheck = at
		}
		if end := at.Add(c.Learned.Request); end.After(readyBy) {
			readyBy = end
		}
		holders = append(holders, Holder{c.Name, label, c.shareOn(short)})
	}
	if known {
		t.ReadyBy = readyBy
	}
	if len(left) > 0 {
		// The rest is promised to waiters ahead, or held by models still
		// loading for them: wait for them to have their turn.
		for _, o := range r.byLRU {
			if !r.taken[o.Name] && (r.ahead[o.Name] || (o.State == lifecycle.Waking && !r.waiting[o.Name])) && o.toLoadOn(left) > 0 {
				holders = append(holders, Holder{o.Name, HoldAhead, o.toLoadOn(left)})
			}
		}
	}
	t.Verdict, t.Holders = RoomWait, holders
	t.Message = fmt.Sprintf("%s (%s) waits for GPU memory (%s short) held by %s", m.Name, gib(m.Footprint), perGPU(short), HolderList(holders))
	if len(holders) == 0 {
		t.Message = fmt.Sprintf("%s (%s) waits for GPU memory (%s short)", m.Name, gib(m.Footprint), perGPU(short))
	}
	return t
}

// choose picks holders for w among those ok accepts and not yet taken,
// least recently used first until left is covered, then drops any whose
// memory the others already cover, most recently used first, so the least
// memory moves. It subtracts what the chosen free from left.
func (r *roomPlanner) choose(w *Model, left map[int]int64, ok func(*Model) bool) []*Model {
	if len(left) == 0 {
		return nil
	}
	var picked []*Model
	trial := maps.Clone(left)
	for _, c := range r.byLRU {
		if len(trial) == 0 {
			break
		}
		if c.Name != w.Name && !r.taken[c.Name] && !r.waiting[c.Name] && ok(c) && relieve(trial, c) {
			picked = append(picked, c)
		}
	}
	for i := len(picked) - 1; i >= 0 && len(picked) > 1; i-- {
		rest := slices.Delete(slices.Clone(picked), i, i+1)
		if covers(left, rest) {
			picked = rest
		}
	}
	for _, c := range picked {
		relieve(left, c)
	}
	return picked
}

// covers reports whether putting ms to sleep would free all of short.
func covers(short map[int]int64, ms []*Model) bool {
	left := maps.Clone(short)
	for _, m := range ms {
		relieve(left, m)
	}
	return len(left) == 0
}

// never checks w could fit at all: on each GPU, what is left after the
// reserve and the memory that waiting cannot free (pinned models, models
// whose idleness cannot be proven, sleeping engines, other processes). When
// it cannot, it returns those holders, largest first, the 503's message and
// false.
func (r *roomPlanner) never(w *Model, need map[int]int64) ([]Holder, string, bool) {
	for _, g := range slices.Sorted(maps.Keys(need)) {
		dev, _ := r.in.gpuOf(g)
		reserve := r.in.Pressure.GPUReserve
		room := dev.Total - reserve - w.live(g)
		var fixed []Holder
		owned := w.GPUBytes[g]
		for _, m := range r.byLRU {
			if m.Name == w.Name {
				continue
			}
			owned += m.GPUBytes[g]
			if label := m.fixed(); label != "" && m.GPUBytes[g] > 0 {
				fixed = append(fixed, Holder{m.Name, label, m.GPUBytes[g]})
				room -= m.GPUBytes[g]
			}
		}
		if other := dev.Total - dev.Free - owned; other > 0 {
			fixed = append(fixed, Holder{"", "", other})
			room -= other
		}
		if need[g] <= room {
			continue
		}
		slices.SortStableFunc(fixed, func(a, b Holder) int { return cmp.Compare(b.Bytes, a.Bytes) })
		msg := fmt.Sprintf("cannot fit %s (%s) on GPU %d (%s, gpu_reserve %s)", w.Name, gib(w.Footprint), g, gib(dev.Total), gib(reserve))
		if len(fixed) == 0 {
			msg += ": larger than the GPU after the reserve"
		} else {
			msg += fmt.Sprintf(": held by %s, which waiting cannot free", HolderList(fixed))
		}
		if r.in.GPUNote != "" {
			msg += " (" + r.in.GPUNote + ")"
		}
		return fixed, msg, false
	}
	return nil, "", true
}

// fixed labels a model whose memory waiting cannot free; "" if it can.
func (m *Model) fixed() Hold {
	switch {
	case m.pinned():
		return HoldPinned
	case m.State == lifecycle.Sleeping:
		return HoldSleeping
	case m.State == lifecycle.Draining, m.State == lifecycle.Waking:
		return "" // not serving, so not scraped: judged once awake
	case m.Engine == EngineNone && !m.AllowUntracked:
		return HoldUntracked
	}
	return ""
}

// demandIdle reports a holder that may be put to sleep now for a waiting
// request: awake, unpinned and proven idle. Unlike evictable it ignores the
// idle minimum: demand overrides anti-flap.
func (m *Model) demandIdle() bool {
	return m.State == lifecycle.Awake && !m.pinned() && m.idle()
}

// demandBusy reports a holder that will be free to sleep once its requests
// end: unpinned, with napd's leases live (or loading), and idleness it can
// prove then.
func (m *Model) demandBusy() bool {
	if m.pinned() || m.fixed() != "" {
		return false
	}
	switch m.State {
	case lifecycle.Waking:
		return true
	case lifecycle.Awake:
		return m.Leases.Active > 0 || m.Engine == EngineBusy
	}
	return false
}

// yieldAt is when busy holder h stops admitting for waiter w: yield_after
// after w's oldest request, or earlier when w's deadline would otherwise
// pass before w could wake and h finish a typical request; never before
// w started waiting.
func (r *roomPlanner) yieldAt(h, w *Model, wt Waiter) time.Time {
	at := wt.Oldest.Add(h.YieldAfter)
	if !wt.Deadline.IsZero() {
		latest := wt.Deadline.Add(-w.wakeEstimate() - h.Learned.Request)
		if latest.Before(at) {
			at = latest
		}
	}
	if at.Before(wt.Oldest) {
		at = wt.Oldest
	}
	return at
}

// retryAfter is what a refused waiter's client should wait: its typical
// wake plus the longest typical request among the holders, at least 1s.
func (r *roomPlanner) retryAfter(w *Model, holders []Holder) time.Duration {
	var req time.Duration
	for _, h := range holders {
		for _, m := range r.byLRU {
			if m.Name == h.Model {
				req = max(req, m.Learned.Request)
			}
		}
	}
	return max(w.wakeEstimate()+req, time.Second)
}

func (m *Model) wakeEstimate() time.Duration {
	if m.Learned.Wake > 0 {
		return m.Learned.Wake
	}
	return unknownWake
}

// shareOn is what m holds on the given GPUs.
func (m *Model) shareOn(gpus map[int]int64) int64 {
	var b int64
	for g := range gpus {
		b += m.gpuShare(g)
	}
	return b
}

// toLoadOn is what m still has to load on the given GPUs.
func (m *Model) toLoadOn(gpus map[int]int64) int64 {
	var b int64
	for g := range gpus {
		b += m.toLoad(g)
	}
	return b
}
