package agent

import (
	"math/bits"
	"net/http"
	"sync"

	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
)

// placements are the GPU sets napd chose for models with gpus = "any" or
// { count = N }: remembered in state_dir (placements.json, one bitmask of
// GPU indexes per model) so the next wake prefers the same set and a
// restarted napd knows where an adopted engine runs. why is the last
// choice's message, for status.
type placements struct {
	mu  sync.Mutex
	why map[string]string
}

// gpusOf is the GPUs a model runs on, or would wake on: its fixed list, or
// the set chosen last for it (nil before its first placed wake).
func (a *Agent) gpusOf(s model.Snapshot) []int {
	if s.Config.GPUCount == 0 {
		return s.Config.GPUs
	}
	mask, _ := a.placed.Get(s.Config.Name)
	return maskGPUs(mask)
}

// place chooses the GPUs of a placed model's wake, before it checks that
// it fits: nil for a model with a fixed list. An engine process that still
// runs (asleep in a strategy that keeps it) stays where it is.
func (a *Agent) place(ms *measurement, name string) ([]int, error) {
	m := a.reg.Load().byName[name]
	if m == nil {
		return nil, nil
	}
	s := m.Snapshot()
	if s.Config.GPUCount == 0 {
		return nil, nil
	}
	last := a.gpusOf(s)
	if len(last) > 0 && len(ms.models[name].proc.PIDs) > 0 {
		return last, nil
	}
	p := planner.Place(a.plannerInput(ms), name, s.Config.GPUCount, last)
	if p.GPUs == nil {
		if len(ms.gpus.Devices) == 0 && ms.gpuFrom == gpuLive {
			return nil, nil // a host without GPUs: nothing to choose
		}
		return nil, &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: "insufficient_gpu_memory",
			Message: "cannot place " + p.Message}
	}
	a.log.Info("gpus chosen", "model", name, "gpus", p.GPUs, "fits", p.Fits, "why", p.Message)
	if err := a.placed.Remember(name, gpusMask(p.GPUs)); err != nil {
		a.log.Warn("remember gpus", "model", name, "err", err)
	}
	a.placement.mu.Lock()
	a.placement.why[name] = p.Message
	a.placement.mu.Unlock()
	return p.GPUs, nil
}

// placedWhy is the last placement message of a model, "" when none.
func (a *Agent) placedWhy(name string) string {
	a.placement.mu.Lock()
	defer a.placement.mu.Unlock()
	return a.placement.why[name]
}

// gpusMask encodes a GPU set for the memo; indexes above 62 are not
// remembered (the memo holds positive int64s).
func gpusMask(gpus []int) int64 {
	var mask int64
	for _, g := range gpus {
		if g >= 0 && g < 63 {
			mask |= 1 << g
		}
	}
	return mask
}

func maskGPUs(mask int64) []int {
	var gpus []int
	for m := uint64(mask); m != 0; m &= m - 1 {
		gpus = append(gpus, bits.TrailingZeros64(m))
	}
	return gpus
}
