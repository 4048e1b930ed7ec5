package planner

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/priority"
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
	// Queued is, by class, when its oldest waiting request of each
	// arrived (nil: no classes, or no request queued, as an operator's
	// wake). Its class, aged by priority_age, goes before Oldest: a waiter
	// of a higher class has its turn before older ones of lower classes.
	Queued *priority.Oldest
}

// class is the waiter's class at now: the highest of its queued requests,
// aged (None without classes).
func (w Waiter) class(now time.Time, age time.Duration) priority.Class {
	if w.Queued == nil {
		return priority.None
	}
	c, _ := w.Queued.Best(now, age)
	return c
}

// waits is each class the waiter's requests count as at now, with the
// arrival of the oldest request of that class; one entry of class None at
// Oldest without classes.
func (w Waiter) waits(now time.Time, age time.Duration) []classWait {
	if w.Queued == nil {
		return []classWait{{priority.None, w.Oldest}}
	}
	var out []classWait
	for i, at := range w.Queued {
		if !at.IsZero() {
			out = append(out, classWait{priority.Class(i+1).Aged(now.Sub(at), age), at})
		}
	}
	return out
}

type classWait struct {
	class priority.Class
	since time.Time
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
	// Class is the holder's class where it decides the wait (it differs
	// from the waiter's), and Note what that means: "yields in 4s", "does
	// not yield to batch"; both "" otherwise.
	Class, Note string
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
	what := gib(h.Bytes)
	if h.Class != "" {
		what = h.Class + ", " + what
	}
	if h.Note != "" {
		what += "; " + h.Note
	}
	return fmt.Sprintf("%s (%s)", name, what)
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
// of their class (the highest of their waiting requests, aged by
// priority_age), then of their oldest waiting request (fair turns):
//   - a waiter whose footprint fits in free memory minus gpu_reserve, after
//     what loading models and the waiters ahead of it take, wakes now;
//   - one that could never fit because pinned models, models whose idleness
//     cannot be proven, sleeping engines or other processes hold the rest,
//     or that is larger than its GPUs after the reserve, is refused;
//   - otherwise it waits. Memory draining back counts first; then idle,
//     unpinned holders are put to sleep at once (demand overrides the idle
//     minimum), least recently used first, keeping only those needed so
//     the least memory moves (holders whose recent use was of the lowest
//     class first); then busy holders are chosen the same way, and each
//     keeps admitting until it yields (see yieldAt): yield_after after the
//     waiter's oldest request of its own class, priority_yield_after of its
//     class after one of a higher class, never to a lower class.
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
	now, age := in.Now, in.PriorityAge
	slices.SortStableFunc(order, func(a, b Waiter) int {
		switch ca, cb := a.class(now, age), b.class(now, age); {
		case ca.Above(cb):
			return -1
		case cb.Above(ca):
			return 1
		}
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
			holders = append(holders, Holder{Model: d.Name, Label: HoldDraining, Bytes: d.shareOn(short)})
		}
	}
	idle := r.choose(m, left, func(c *Model) bool { return c.demandIdle() })
	busy := r.choose(m, left, func(c *Model) bool { return c.demandBusy() })
	for _, c := range idle {
		r.taken[c.Name] = true
		why := fmt.Sprintf("make room for %s (%s), waiting since %s; frees %s",
			m.Name, gib(m.Footprint), w.Oldest.Format(time.TimeOnly), c.freesOn(short))
		r.decide(c, ReasonMakeRoom, why)
		holders = append(holders, Holder{Model: c.Name, Label: HoldIdle, Bytes: c.shareOn(short)})
	}
	wc := w.class(r.in.Now, r.in.PriorityAge)
	// A holder's class differs from the waiter's: messages name them.
	classes := false
	// Idle and draining holders free theirs now.
	readyBy, known := r.in.Now, len(left) == 0
	for _, c := range busy {
		r.taken[c.Name] = true
		h := Holder{Model: c.Name, Label: HoldBusy, Bytes: c.shareOn(short)}
		y := r.yieldAt(c, m, w)
		at := y.at
		if hc := r.holderClass(c); wc.Set() && hc.Set() && hc != wc && c.State == lifecycle.Awake && c.Leases.Active > 0 {
			h.Class, classes = r.in.Classes.Name(hc), true
		}
		switch {
		case c.State == lifecycle.Waking:
			h.Label, known = HoldWaking, false
		case c.Leases.Active == 0:
			// Work napd did not admit (the engine says busy): it cannot be
			// told to yield; its memory comes back when it ends.
			known = false
		case y.never:
			h.Note = "does not yield to " + r.in.Classes.Name(wc)
			known = false
		case !r.in.Now.Before(y.at):
			h.Label = HoldYielding
			r.decide(c, ReasonYield, r.yieldWhy(c, m, y, short))
			at = r.in.Now
		default:
			if h.Class != "" {
				h.Note = "yields in " + y.at.Sub(r.in.Now).Round(time.Second).String()
			}
			if plan.Recheck.IsZero() || y.at.Before(plan.Recheck) {
				plan.Recheck = y.at
			}
		}
		if end := at.Add(c.Learned.Request); end.After(readyBy) {
			readyBy = end
		}
		holders = append(holders, h)
	}
	if known {
		t.ReadyBy = readyBy
	}
	if len(left) > 0 {
		// The rest is promised to waiters ahead, or held by models still
		// loading for them: wait for them to have their turn.
		for _, o := range r.byLRU {
			if !r.taken[o.Name] && (r.ahead[o.Name] || (o.State == lifecycle.Waking && !r.waiting[o.Name])) && o.toLoadOn(left) > 0 {
				holders = append(holders, Holder{Model: o.Name, Label: HoldAhead, Bytes: o.toLoadOn(left)})
			}
		}
	}
	t.Verdict, t.Holders = RoomWait, holders
	what := gib(m.Footprint)
	if classes {
		what = r.in.Classes.Name(wc) + ", " + what
	}
	t.Message = fmt.Sprintf("%s (%s) waits for GPU memory (%s short) held by %s", m.Name, what, perGPU(short), HolderList(holders))
	if len(holders) == 0 {
		t.Message = fmt.Sprintf("%s (%s) waits for GPU memory (%s short)", m.Name, what, perGPU(short))
	}
	return t
}

// holderClass is the class a busy holder serves: the highest in flight;
// the lowest class when it has requests of no class.
func (r *roomPlanner) holderClass(h *Model) priority.Class {
	if h.Serving.Set() || len(r.in.Classes) == 0 {
		return h.Serving
	}
	return r.in.Classes.Lowest()
}

// yield is when a busy holder stops admitting for a waiter, and by which
// rule.
type yield struct {
	never bool // it serves a class above every class the waiter's requests count as
	at    time.Time
	class priority.Class // the waiter's class the yield is for
	since time.Time      // the arrival of its oldest request of that class
	rule  string         // "yield_after 30s", "priority_yield_after batch = 5s"
}

// yieldAt is when busy holder h stops admitting for waiter w. For each
// class w's requests count as (aged), from the oldest of them: h's own
// yield_after when h serves that class (or there are no classes); the
// priority_yield_after of h's class (else its yield_after) when h serves
// only lower classes; never when h serves a higher one. The earliest of
// these, or earlier when w's deadline would otherwise pass before w could
// wake and h finish a typical request; never before w started waiting.
func (r *roomPlanner) yieldAt(h, w *Model, wt Waiter) yield {
	hc := r.holderClass(h)
	y := yield{never: true}
	for _, cw := range wt.waits(r.in.Now, r.in.PriorityAge) {
		after, rule := h.YieldAfter, "yield_after "+h.YieldAfter.String()
		switch {
		case !cw.class.Set() || !hc.Set() || cw.class == hc:
		case cw.class.Above(hc):
			if d, ok := r.in.ClassYieldAfter[hc]; ok {
				after, rule = d, fmt.Sprintf("priority_yield_after %s = %s", r.in.Classes.Name(hc), d)
			}
		default:
			continue // h serves a higher class: it does not yield to this one
		}
		if at := cw.since.Add(after); y.never || at.Before(y.at) {
			y = yield{at: at, class: cw.class, since: cw.since, rule: rule}
		}
	}
	if y.never {
		return y
	}
	if !wt.Deadline.IsZero() {
		latest := wt.Deadline.Add(-w.wakeEstimate() - h.Learned.Request)
		if latest.Before(y.at) {
			y.at = latest
		}
	}
	if y.at.Before(wt.Oldest) {
		y.at = wt.Oldest
	}
	return y
}

// yieldWhy is the message of h's yield y to waiter w.
func (r *roomPlanner) yieldWhy(h, w *Model, y yield, short map[int]int64) string {
	waited := r.in.Now.Sub(y.since).Round(time.Second)
	hc := r.holderClass(h)
	if !y.class.Set() || y.class == hc {
		return fmt.Sprintf("yield to %s, which waited %s for its memory (%s); frees %s", w.Name, waited, y.rule, h.freesOn(short))
	}
	return fmt.Sprintf("yield to %s (%s), which waited %s for its memory; %s serves only %s (%s); frees %s",
		w.Name, r.in.Classes.Name(y.class), waited, h.Name, r.in.Classes.Name(hc), y.rule, h.freesOn(short))
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
				fixed = append(fixed, Holder{Model: m.Name, Label: label, Bytes: m.GPUBytes[g]})
				room -= m.GPUBytes[g]
			}
		}
		if other := dev.Total - dev.Free - owned; other > 0 {
			fixed = append(fixed, Holder{Bytes: other})
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
