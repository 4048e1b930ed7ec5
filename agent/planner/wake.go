package planner

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// WakeOutcome says whether a wake can go ahead.
type WakeOutcome int

// Wake outcomes.
const (
	// WakeFits: the footprint fits in free memory minus gpu_reserve on
	// every GPU of the model.
	WakeFits WakeOutcome = iota
	// WakeMakeRoom: it fits once Victims are put to sleep and the memory
	// of models already draining is back. The caller sleeps the victims,
	// then waits until the GPU probe shows the memory free (PlanWake
	// returns WakeFits), within the wake's deadline.
	WakeMakeRoom
	// WakeRefused: busy, pinned or other memory holders leave too little
	// even if every candidate slept; nothing is evicted, and Message names
	// the holders (for the 503).
	WakeRefused
)

func (o WakeOutcome) String() string {
	switch o {
	case WakeFits:
		return "fits"
	case WakeMakeRoom:
		return "make-room"
	}
	return "refused"
}

// WakePlan is PlanWake's answer.
type WakePlan struct {
	Outcome WakeOutcome
	// Victims are the models to put to sleep first (ReasonMakeRoom).
	Victims []Decision
	// Message explains the outcome with its figures.
	Message string
}

// PlanWake decides whether the model named wake fits on its GPUs. Its need
// on each GPU is its footprint's share, less what its processes already
// hold there (a sleeping engine keeps its CUDA context); models that are
// waking reserve their share too. When it does not fit, idle, unpinned
// models that are not flapping are chosen on the short GPUs, least recently
// used first, until it fits; if even all of them would not make it fit,
// none is chosen and the wake is refused. GPUs without a memory reading,
// and a model whose footprint is unknown, are not checked.
func PlanWake(in Input, wake string) WakePlan {
	i := slices.IndexFunc(in.Models, func(m Model) bool { return m.Name == wake })
	if i < 0 {
		return WakePlan{Outcome: WakeRefused, Message: fmt.Sprintf("cannot plan wake of unknown model %q", wake)}
	}
	w := &in.Models[i]
	if w.Footprint <= 0 || len(w.GPUs) == 0 {
		return WakePlan{Outcome: WakeFits, Message: fmt.Sprintf("%s: footprint or GPUs unknown; fit not checked", w.Name)}
	}
	if in.GPUUnknown {
		return WakePlan{Outcome: WakeRefused, Message: fmt.Sprintf("cannot check that %s (%s) fits on GPU %s: %s",
			w.Name, gib(w.Footprint), joinInts(w.GPUs), in.GPUNote)}
	}
	p := newPlanner(&in)
	short := p.wakeShortfall(w)
	if len(short) == 0 {
		return WakePlan{Outcome: WakeFits, Message: fmt.Sprintf("%s (%s) fits on GPU %s", w.Name, gib(w.Footprint), joinInts(w.GPUs))}
	}

	// Memory already on its way back counts first, then victims.
	left := maps.Clone(short)
	for _, m := range p.byLRU {
		if m.State == StateDraining {
			relieve(left, m)
		}
	}
	var victims []*Model
	for _, m := range p.byLRU {
		if len(left) == 0 {
			break
		}
		if m.Name != w.Name && m.evictable(in.Now) && relieve(left, m) {
			victims = append(victims, m)
		}
	}
	if len(left) > 0 {
		msg := p.refusal(w, left)
		if in.GPUNote != "" {
			msg += " (" + in.GPUNote + ")"
		}
		return WakePlan{Outcome: WakeRefused, Message: msg}
	}

	plan := WakePlan{Outcome: WakeMakeRoom}
	waitFor := "models already draining"
	if len(victims) > 0 {
		var names []string
		for _, v := range victims {
			why := fmt.Sprintf("make room for %s (%s); frees %s", w.Name, gib(w.Footprint), v.freesOn(short))
			plan.Victims = append(plan.Victims, p.decide(v, ReasonMakeRoom, why))
			names = append(names, v.Name)
		}
		waitFor = strings.Join(names, ", ")
	}
	plan.Message = fmt.Sprintf("%s (%s) is %s short; making room: %s", w.Name, gib(w.Footprint), perGPU(short), waitFor)
	return plan
}

// wakeShortfall is, per GPU of w with a memory reading, how many bytes are
// missing for w beyond gpu_reserve; GPUs where it fits are absent.
func (p *planner) wakeShortfall(w *Model) map[int]int64 {
	short := make(map[int]int64)
	for _, g := range w.GPUs {
		dev, ok := p.in.gpuOf(g)
		if !ok {
			continue
		}
		need := w.toLoad(g)
		avail := dev.Free - p.in.Pressure.GPUReserve
		for _, m := range p.byLRU {
			if m.Name != w.Name && m.State == StateWaking {
				avail -= m.toLoad(g)
			}
		}
		if need > avail {
			short[g] = need - avail
		}
	}
	return short
}

// toLoad is what m still has to allocate on GPU g to be awake: its
// footprint's share less what its processes already hold there.
func (m *Model) toLoad(g int) int64 {
	if m.Footprint <= 0 || !slices.Contains(m.GPUs, g) {
		return 0
	}
	return max(ceilDiv(m.Footprint, int64(len(m.GPUs)))-m.GPUBytes[g], 0)
}

// relieve subtracts what putting m to sleep frees from the GPUs still short
// and reports whether it freed anything there.
func relieve(left map[int]int64, m *Model) bool {
	freed := false
	for g := range left {
		b := m.gpuShare(g)
		if b <= 0 {
			continue
		}
		freed = true
		if left[g] -= b; left[g] <= 0 {
			delete(left, g)
		}
	}
	return freed
}

// freesOn describes what m frees on the given GPUs.
func (m *Model) freesOn(gpus map[int]int64) string {
	var parts []string
	for _, g := range slices.Sorted(maps.Keys(gpus)) {
		if b := m.gpuShare(g); b > 0 {
			parts = append(parts, fmt.Sprintf("%s on GPU %d", gib(b), g))
		}
	}
	return strings.Join(parts, ", ")
}

// refusal names, for the first GPU that cannot be made to fit, what holds
// its memory: each other model with its label, then memory no model owns.
func (p *planner) refusal(w *Model, left map[int]int64) string {
	g := slices.Min(slices.Collect(maps.Keys(left)))
	dev, _ := p.in.gpuOf(g)
	type holder struct {
		label string
		bytes int64
	}
	var hs []holder
	var owned int64
	for _, m := range p.byLRU {
		if m.Name == w.Name {
			continue
		}
		b := m.GPUBytes[g]
		owned += b
		if m.State == StateWaking {
			b += m.toLoad(g) // what it is about to take
		}
		if b <= 0 {
			continue
		}
		hs = append(hs, holder{m.holds(p.in.Now) + " " + m.Name, b})
	}
	if other := dev.Total - dev.Free - owned - w.GPUBytes[g]; other > 0 {
		hs = append(hs, holder{"other processes", other})
	}
	slices.SortStableFunc(hs, func(a, b holder) int { return cmp.Compare(b.bytes, a.bytes) })
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("%s (%s)", h.label, gib(h.bytes))
	}
	held := "nothing napd knows of"
	if len(parts) > 0 {
		held = strings.Join(parts, ", ")
	}
	msg := fmt.Sprintf("cannot fit %s (%s) on GPU %d: %s free; held by %s", w.Name, gib(w.Footprint), g, gib(dev.Free), held)
	if r := p.in.Pressure.GPUReserve; r > 0 {
		msg += fmt.Sprintf("; gpu_reserve %s", gib(r))
	}
	return msg
}

func perGPU(m map[int]int64) string {
	var parts []string
	for _, g := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s on GPU %d", gib(m[g]), g))
	}
	return strings.Join(parts, ", ")
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}
