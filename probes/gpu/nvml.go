package gpu

import (
	"context"
	"fmt"
	"strconv"

	"github.com/napd/napd/gpuvendor"
)

// NVML is the part of the NVIDIA management library napd uses, so that a
// fake drives the tests. The real one is go-nvml, loaded at run time.
type NVML interface {
	// Init loads and initialises the library; it fails when
	// libnvidia-ml.so.1 is absent or the driver does not answer.
	Init() error
	Shutdown() error
	DeviceCount() (int, error)
	Device(index int) (NVMLDevice, error)
}

// NVMLDevice is one device handle.
type NVMLDevice interface {
	UUID() (string, error)
	Name() (string, error)
	// Memory is in bytes.
	Memory() (total, used, free uint64, err error)
	// ComputeProcesses lists the compute processes on the device; a used
	// figure of NVMLValueNotAvailable means the driver does not know it.
	// On a MIG instance: the processes within it.
	ComputeProcesses() ([]NVMLProcess, error)
	// MIG lists the MIG instances of a GPU in MIG mode, by their MIG
	// device index (NVML's handles, each a device with its own memory and
	// processes; an index without an instance is nil); nil for a GPU not
	// in MIG mode, or one that has no MIG.
	MIG() ([]NVMLDevice, error)
}

// NVMLProcess is one compute process as NVML reports it.
type NVMLProcess struct {
	PID  uint32
	Used uint64
}

// NVMLValueNotAvailable is NVML_VALUE_NOT_AVAILABLE, reported as a
// process's used memory when it is unknown (e.g. under some drivers or
// without permission).
const NVMLValueNotAvailable = ^uint64(0)

// NVMLProbe is the Probe over an initialised NVML.
type NVMLProbe struct {
	lib NVML
}

// OpenNVML initialises lib; the error says why NVML cannot be used.
func OpenNVML(lib NVML) (*NVMLProbe, error) {
	if err := lib.Init(); err != nil {
		return nil, fmt.Errorf("nvml init: %w", err)
	}
	return &NVMLProbe{lib: lib}, nil
}

// Close shuts NVML down.
func (p *NVMLProbe) Close() error {
	if err := p.lib.Shutdown(); err != nil {
		return fmt.Errorf("nvml shutdown: %w", err)
	}
	return nil
}

// Snapshot implements Probe.
func (p *NVMLProbe) Snapshot(ctx context.Context) (Snapshot, error) {
	n, err := p.lib.DeviceCount()
	if err != nil {
		return Snapshot{}, fmt.Errorf("nvml device count: %w", err)
	}
	snap := Snapshot{Source: SourceNVML}
	for i := range n {
		if err := ctx.Err(); err != nil {
			return Snapshot{}, err
		}
		h, err := p.lib.Device(i)
		if err != nil {
			return Snapshot{}, fmt.Errorf("nvml device %d: %w", i, err)
		}
		migs, err := h.MIG()
		if err != nil {
			return Snapshot{}, fmt.Errorf("nvml device %d: mig: %w", i, err)
		}
		if migs == nil {
			d, procs, err := p.device(h, len(snap.Devices), strconv.Itoa(i))
			if err != nil {
				return Snapshot{}, fmt.Errorf("nvml device %d: %w", i, err)
			}
			snap.Devices = append(snap.Devices, d)
			snap.Processes = append(snap.Processes, procs...)
			continue
		}
		for m, mh := range migs {
			if mh == nil {
				continue
			}
			// nvidia-ctk's CDI name of an instance is GPU:MIG.
			d, procs, err := p.device(mh, len(snap.Devices), strconv.Itoa(i)+":"+strconv.Itoa(m))
			if err != nil {
				return Snapshot{}, fmt.Errorf("nvml device %d: mig device %d: %w", i, m, err)
			}
			d.Visible = d.UUID // CUDA selects a MIG instance by its MIG-… UUID only
			snap.Devices = append(snap.Devices, d)
			snap.Processes = append(snap.Processes, procs...)
		}
	}
	return snap, nil
}

// device reads one device (a GPU or a MIG instance) as napd's device i.
func (p *NVMLProbe) device(h NVMLDevice, i int, node string) (Device, []Process, error) {
	d := Device{Index: i, Vendor: gpuvendor.NVIDIA, Visible: node, Node: node, HaveMemory: true}
	var err error
	if d.UUID, err = h.UUID(); err != nil {
		return Device{}, nil, fmt.Errorf("uuid: %w", err)
	}
	if d.Name, err = h.Name(); err != nil {
		return Device{}, nil, fmt.Errorf("name: %w", err)
	}
	total, used, free, err := h.Memory()
	if err != nil {
		return Device{}, nil, fmt.Errorf("memory: %w", err)
	}
	d.Total, d.Used, d.Free = int64(total), int64(used), int64(free)
	list, err := h.ComputeProcesses()
	if err != nil {
		return Device{}, nil, fmt.Errorf("compute processes: %w", err)
	}
	procs := make([]Process, 0, len(list))
	for _, np := range list {
		proc := Process{PID: int(np.PID), GPUIndex: d.Index, GPUUUID: d.UUID}
		if np.Used != NVMLValueNotAvailable {
			proc.Used, proc.HaveUsed = int64(np.Used), true
		}
		procs = append(procs, proc)
	}
	return d, procs, nil
}
