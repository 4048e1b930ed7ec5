package supervisor

import (
	"maps"
	"testing"

	"github.com/napd/napd/gpuvendor"
)

func TestVisibleDevices(t *testing.T) {
	for name, c := range map[string]struct {
		spec Spec
		want map[string]string
	}{
		"none": {Spec{}, nil},
		"indexes without a reading are NVIDIA's": {Spec{GPUs: []int{2, 0}},
			map[string]string{"CUDA_VISIBLE_DEVICES": "2,0"}},
		"a MIG instance by its UUID": {Spec{GPUs: []int{1}, Devices: []GPU{{Vendor: gpuvendor.NVIDIA, ID: "MIG-0b1c", Node: "0:2"}}},
			map[string]string{"CUDA_VISIBLE_DEVICES": "MIG-0b1c"}},
		// ROCR selects agents 2 and 3, HIP counts among what ROCR left.
		"ROCm": {Spec{GPUs: []int{4, 5}, Devices: []GPU{{Vendor: gpuvendor.AMD, ID: "2"}, {Vendor: gpuvendor.AMD, ID: "3"}}},
			map[string]string{"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "0,1"}},
		"Level Zero in PCI order": {Spec{GPUs: []int{1}, Devices: []GPU{{Vendor: gpuvendor.Intel, ID: "0"}}},
			map[string]string{"ZE_AFFINITY_MASK": "0", "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}},
	} {
		if got := c.spec.VisibleDevices(); !maps.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}
