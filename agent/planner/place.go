package planner

import (
	"fmt"
	"slices"
	"strings"
)

// Placement is Place's answer: the GPUs a model with gpus = "any" or
// { count = N } wakes on, and the figures the choice was made on.
type Placement struct {
	// GPUs is the chosen set, sorted; nil when the host has fewer GPUs
	// reporting memory than the model needs.
	GPUs []int
	// Fits: the model fits there now (otherwise its wake waits for room
	// there, or is refused, like any wake).
	Fits bool
	// Headroom is, per chosen GPU, what stays free after the reserve,
	// the models loading and the model's own share.
	Headroom map[int]int64
	// Message says it for a human, with the figures.
	Message string
}

// Place chooses count GPUs for the named model's wake: among the sets where
// it fits (its footprint spread evenly, within free memory less gpu_reserve
// and what models loading will take), the last set when it is one of them
// (warm caches, stable logs), else the one whose tightest GPU keeps the most
// free memory. When it fits nowhere, the set short the least: its wake then
// waits for room there. With no footprint the freest set is chosen.
func Place(in Input, model string, count int, last []int) Placement {
	p := newPlanner(&in)
	r := &roomPlanner{planner: p, waiting: map[string]bool{model: true},
		now: make(map[int]int64), coming: make(map[int]int64)}
	r.start()
	var m Model
	if i := slices.IndexFunc(in.Models, func(m Model) bool { return m.Name == model }); i >= 0 {
		m = in.Models[i]
	}
	var gpus []int
	byIndex := make(map[int]GPU, len(in.GPUs))
	for _, g := range in.GPUs {
		gpus = append(gpus, g.Index)
		byIndex[g.Index] = g
	}
	slices.Sort(gpus)
	if count <= 0 || len(gpus) < count {
		return Placement{Message: fmt.Sprintf("%s needs %d GPUs, %d report memory", model, count, len(gpus))}
	}
	share := int64(0)
	if m.Footprint > 0 {
		share = ceilDiv(m.Footprint, int64(count))
	}
	headroom := func(set []int) (worst int64, per map[int]int64) {
		per = make(map[int]int64, len(set))
		for i, g := range set {
			per[g] = r.now[g] - max(share-m.live(g), 0)
			if i == 0 || per[g] < worst {
				worst = per[g]
			}
		}
		return worst, per
	}
	var best Placement
	var bestWorst int64
	for _, set := range combinations(gpus, count) {
		if !together(set, byIndex) {
			continue
		}
		worst, per := headroom(set)
		if worst >= 0 && slices.Equal(set, last) {
			best, bestWorst = Placement{GPUs: set, Headroom: per}, worst
			break
		}
		if best.GPUs == nil || worst > bestWorst {
			best, bestWorst = Placement{GPUs: set, Headroom: per}, worst
		}
	}
	if best.GPUs == nil {
		return Placement{Message: fmt.Sprintf("%s needs %d GPUs of one vendor, none of them a MIG instance", model, count)}
	}
	best.Fits = bestWorst >= 0
	var parts []string
	for _, g := range best.GPUs {
		parts = append(parts, fmt.Sprintf("GPU %d keeps %s", g, gib(best.Headroom[g])))
	}
	why := "the most free memory"
	switch {
	case !best.Fits:
		why = "fits nowhere now, short the least"
	case slices.Equal(best.GPUs, last):
		why = "the set used last, which fits"
	}
	best.Message = fmt.Sprintf("%s on GPU %s (%s, share %s each): %s after gpu_reserve %s",
		model, joinInts(best.GPUs), why, gib(share), strings.Join(parts, ", "), gib(in.Pressure.GPUReserve))
	return best
}

// together tells whether one engine can run on set: one vendor's GPUs, a
// MIG instance only alone.
func together(set []int, gpus map[int]GPU) bool {
	if len(set) < 2 {
		return true
	}
	for _, g := range set {
		if d := gpus[g]; d.Alone || d.Vendor != gpus[set[0]].Vendor {
			return false
		}
	}
	return true
}

// combinations lists the k-element subsets of xs (sorted), in
// lexicographic order.
func combinations(xs []int, k int) [][]int {
	var out [][]int
	var walk func(start int, cur []int)
	walk = func(start int, cur []int) {
		if len(cur) == k {
			out = append(out, slices.Clone(cur))
			return
		}
		for i := start; i <= len(xs)-(k-len(cur)); i++ {
			walk(i+1, append(cur, xs[i]))
		}
	}
	walk(0, nil)
	return out
}
