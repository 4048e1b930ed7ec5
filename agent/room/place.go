package room

import (
	"math/bits"
	"net/http"
	"sync"

	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
)

// placements are the messages of the GPU sets napd chose for models with
// gpus = "any" or { count = N }, for status. The sets themselves are
// remembered in Deps.Placements (state_dir's placements.json, one bitmask
// of GPU indexes per model), so the next wake prefers the same set and a
// restarted napd knows where an adopted engine runs.
type placements struct {
	mu  sync.Mutex
	why map[string]string
}

// GPUs is the GPUs a model runs on, or would wake on: its fixed list, or
// the set chosen last for it (nil before its first placed wake).
func (d *Desk) GPUs(s model.Snapshot) []int {
	if s.Config.GPUCount == 0 {
		return s.Config.GPUs
	}
	mask, _ := d.d.Placements.Get(s.Config.Name)
	return maskGPUs(mask)
}

// place chooses the GPUs of a placed model's wake, before it checks that
// it fits: nil for a model with a fixed list. An engine process that still
// runs (asleep in a strategy that keeps it) stays where it is.
func (d *Desk) place(ms *measure.Measurement, models []Model, name string) ([]int, error) {
	m := find(models, name)
	if m == nil {
		return nil, nil
	}
	s := m.Snapshot()
	if s.Config.GPUCount == 0 {
		return nil, nil
	}
	last := d.GPUs(s)
	if len(last) > 0 && len(ms.Models[name].Proc.PIDs) > 0 {
		return last, nil
	}
	p := planner.Place(d.input(ms, models), name, s.Config.GPUCount, last)
	if p.GPUs == nil {
		if len(ms.GPUs.Devices) == 0 && ms.GPUFrom == measure.GPULive {
			return nil, nil // a host without GPUs: nothing to choose
		}
		return nil, &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: gateway.CodeInsufficientGPUMemory,
			Message: "cannot place " + p.Message}
	}
	d.d.Log.Info("gpus chosen", "model", name, "gpus", p.GPUs, "fits", p.Fits, "why", p.Message)
	if err := d.d.Placements.Remember(name, gpusMask(p.GPUs)); err != nil {
		d.d.Log.Warn("remember gpus", "model", name, "err", err)
	}
	d.placement.mu.Lock()
	d.placement.why[name] = p.Message
	d.placement.mu.Unlock()
	return p.GPUs, nil
}

// PlacedWhy is the last placement message of a model, "" when none.
func (d *Desk) PlacedWhy(name string) string {
	d.placement.mu.Lock()
	defer d.placement.mu.Unlock()
	return d.placement.why[name]
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
