// Package gpu measures GPU memory per device and per process, through NVML
// (loaded at run time) or, when NVML cannot load, nvidia-smi. A host with
// neither has no GPUs, which is not an error.
//
// It only measures: it must not change a GPU's state (no reset, no clocks,
// no MIG), and a probe that fails says so instead of guessing.
package gpu

import (
	"context"
	"log/slog"
	"os/exec"
)

// Sources a Snapshot can come from.
const (
	SourceNVML = "nvml"
	SourceSMI  = "nvidia-smi"
	SourceNone = "none"
)

// Device is one GPU. Memory figures are bytes and valid only when
// HaveMemory (some boards, e.g. unified-memory ones, do not report them).
type Device struct {
	Index      int
	UUID       string
	Name       string
	Total      int64
	Used       int64
	Free       int64
	HaveMemory bool
}

// Process is one compute process on one GPU. A process using several GPUs
// appears once per GPU. Used is valid only when HaveUsed (without the
// permission, or under some drivers, the figure is not available).
type Process struct {
	PID      int
	GPUIndex int
	GPUUUID  string
	Used     int64
	HaveUsed bool
}

// Snapshot is one reading of every GPU and its compute processes.
type Snapshot struct {
	Source    string // SourceNVML, SourceSMI or SourceNone
	Devices   []Device
	Processes []Process
}

// Device returns the device with the given index.
func (s Snapshot) Device(index int) (Device, bool) {
	for _, d := range s.Devices {
		if d.Index == index {
			return d, true
		}
	}
	return Device{}, false
}

// Probe reads GPU memory.
type Probe interface {
	Snapshot(ctx context.Context) (Snapshot, error)
}

// None is the Probe of a host without NVML or nvidia-smi: no GPUs.
type None struct{}

// Snapshot implements Probe.
func (None) Snapshot(context.Context) (Snapshot, error) {
	return Snapshot{Source: SourceNone}, nil
}

// Open picks the best available probe: NVML, else nvidia-smi found on PATH
// (checked with one query), else None. The returned function releases the
// probe (NVML's Shutdown) and must be called once at exit.
func Open(ctx context.Context, logger *slog.Logger) (Probe, func() error) {
	return open(ctx, systemNVML(), logger)
}

func open(ctx context.Context, lib NVML, logger *slog.Logger) (Probe, func() error) {
	if logger == nil {
		logger = slog.Default()
	}
	noop := func() error { return nil }
	p, err := OpenNVML(lib)
	if err == nil {
		logger.Info("gpu probe", "source", SourceNVML)
		return p, p.Close
	}
	logger.Info("gpu probe: NVML unavailable", "err", err)
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		logger.Info("gpu probe: no nvidia-smi on PATH; no GPUs")
		return None{}, noop
	}
	smi := &SMI{Path: path}
	if _, err := smi.Snapshot(ctx); err != nil {
		logger.Warn("gpu probe: nvidia-smi fails; no GPUs", "path", path, "err", err)
		return None{}, noop
	}
	logger.Info("gpu probe", "source", SourceSMI, "path", path)
	return smi, noop
}

// ModelUsage sums the GPU memory of each model's processes per GPU index:
// pids maps a model to its engine's processes (from the supervisor: the
// unit's cgroup or the process group). Processes whose usage is unknown add
// nothing; models with no measured process are absent from the result.
func ModelUsage(pids map[string][]int, procs []Process) map[string]map[int]int64 {
	owner := make(map[int]string)
	for model, list := range pids {
		for _, pid := range list {
			owner[pid] = model
		}
	}
	usage := make(map[string]map[int]int64)
	for _, p := range procs {
		model, ok := owner[p.PID]
		if !ok || !p.HaveUsed {
			continue
		}
		if usage[model] == nil {
			usage[model] = make(map[int]int64)
		}
		usage[model][p.GPUIndex] += p.Used
	}
	return usage
}
