//go:build cgo

package gpu

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// goNVML adapts go-nvml, which dlopens libnvidia-ml.so.1 in Init.
type goNVML struct{ lib nvml.Interface }

func systemNVML() NVML { return goNVML{lib: nvml.New()} }

func check(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return ret
}

func (g goNVML) Init() error     { return check(g.lib.Init()) }
func (g goNVML) Shutdown() error { return check(g.lib.Shutdown()) }

func (g goNVML) DeviceCount() (int, error) {
	n, ret := g.lib.DeviceGetCount()
	return n, check(ret)
}

func (g goNVML) Device(index int) (NVMLDevice, error) {
	d, ret := g.lib.DeviceGetHandleByIndex(index)
	if err := check(ret); err != nil {
		return nil, err
	}
	return goDevice{d}, nil
}

type goDevice struct{ d nvml.Device }

func (g goDevice) UUID() (string, error) {
	s, ret := g.d.GetUUID()
	return s, check(ret)
}

func (g goDevice) Name() (string, error) {
	s, ret := g.d.GetName()
	return s, check(ret)
}

func (g goDevice) Memory() (total, used, free uint64, err error) {
	m, ret := g.d.GetMemoryInfo()
	return m.Total, m.Used, m.Free, check(ret)
}

func (g goDevice) ComputeProcesses() ([]NVMLProcess, error) {
	list, ret := g.d.GetComputeRunningProcesses()
	if err := check(ret); err != nil {
		return nil, err
	}
	out := make([]NVMLProcess, len(list))
	for i, p := range list {
		out[i] = NVMLProcess{PID: p.Pid, Used: p.UsedGpuMemory}
	}
	return out, nil
}

func (g goDevice) MIG() ([]NVMLDevice, error) {
	current, _, ret := g.d.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED || (ret == nvml.SUCCESS && current != nvml.DEVICE_MIG_ENABLE) {
		return nil, nil
	}
	if err := check(ret); err != nil {
		return nil, err
	}
	n, ret := g.d.GetMaxMigDeviceCount()
	if err := check(ret); err != nil {
		return nil, err
	}
	out := make([]NVMLDevice, n)
	for i := range n {
		h, ret := g.d.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue // no instance at this index
		}
		if err := check(ret); err != nil {
			return nil, err
		}
		out[i] = goDevice{h}
	}
	return out, nil
}
