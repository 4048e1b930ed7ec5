package supervisor

import (
	"strconv"
	"strings"

	"github.com/napd/napd/gpuvendor"
)

// GPU is one device of a Spec's placement, as its vendor's runtime is told
// of it.
type GPU struct {
	Vendor string // a gpuvendor constant
	// ID is its entry in the vendor's visibility variable: an NVML index
	// or a MIG-… UUID (CUDA_VISIBLE_DEVICES), a ROCm agent index
	// (ROCR_VISIBLE_DEVICES), a Level Zero index in PCI order
	// (ZE_AFFINITY_MASK).
	ID string
	// Node is how a container is given it: NVIDIA's CDI device name
	// (podman), a render node path for AMD and Intel.
	Node string
}

// VisibleDevices is the environment that shows the engine the GPUs of its
// placement, and only those: per vendor, its runtime's own variable.
// Without Devices (no GPU reading at the wake) the GPUs are taken for
// NVIDIA's indexes, as they are on a host with NVIDIA GPUs only.
//
// ROCm reads two: ROCR_VISIBLE_DEVICES selects the agents, and
// HIP_VISIBLE_DEVICES counts among those it left (0..n-1), so the two agree
// whatever HIP's own order; Ray, under vLLM, refuses ROCR_VISIBLE_DEVICES
// without HIP_VISIBLE_DEVICES. ZE_ENABLE_PCI_ID_DEVICE_ORDER makes Level
// Zero count in PCI order, as napd does.
func (s Spec) VisibleDevices() map[string]string {
	if len(s.GPUs) == 0 {
		return nil
	}
	ids := make(map[string][]string)
	for _, g := range s.GPUDevices() {
		ids[g.Vendor] = append(ids[g.Vendor], g.ID)
	}
	env := make(map[string]string)
	if v := ids[gpuvendor.NVIDIA]; len(v) > 0 {
		env["CUDA_VISIBLE_DEVICES"] = strings.Join(v, ",")
	}
	if v := ids[gpuvendor.AMD]; len(v) > 0 {
		env["ROCR_VISIBLE_DEVICES"] = strings.Join(v, ",")
		rel := make([]string, len(v))
		for i := range v {
			rel[i] = strconv.Itoa(i)
		}
		env["HIP_VISIBLE_DEVICES"] = strings.Join(rel, ",")
	}
	if v := ids[gpuvendor.Intel]; len(v) > 0 {
		env["ZE_AFFINITY_MASK"] = strings.Join(v, ",")
		env["ZE_ENABLE_PCI_ID_DEVICE_ORDER"] = "1"
	}
	return env
}

// GPUDevices is Devices, or the GPUs taken for NVIDIA's indexes.
func (s Spec) GPUDevices() []GPU {
	if len(s.Devices) > 0 {
		return s.Devices
	}
	out := make([]GPU, len(s.GPUs))
	for i, g := range s.GPUs {
		id := strconv.Itoa(g)
		out[i] = GPU{Vendor: gpuvendor.NVIDIA, ID: id, Node: id}
	}
	return out
}
