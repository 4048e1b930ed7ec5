package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/napd/napd/sleepmode"
)

// toLoad is what m still has to allocate on GPU g to be awake: its
// footprint's share less what its engine already holds there.
func (m *Model) toLoad(g int) int64 {
	if m.Footprint <= 0 || !slices.Contains(m.GPUs, g) {
		return 0
	}
	return max(ceilDiv(m.Footprint, int64(len(m.GPUs)))-m.live(g), 0)
}

// live is what m's engine holds on GPU g that a wake reuses: nothing once
// the engine is stopped, whatever a reading still shows.
func (m *Model) live(g int) int64 {
	if m.Slept == sleepmode.Stop {
		return 0
	}
	return m.GPUBytes[g]
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
