// Package gpu measures GPU memory per device and per process: NVIDIA's
// through NVML (loaded at run time) or, when NVML cannot load, nvidia-smi;
// every other vendor's (AMD, Intel) through the kernel's DRM interfaces
// (probes/drm). A host with none of them has no GPUs, which is not an
// error. It is the probe seam: one Snapshot of every device, whatever
// measured it, each with its vendor and how an engine is given it.
//
// It only measures: it must not change a GPU's state (no reset, no clocks,
// no MIG layout), and a probe that fails says so instead of guessing.
package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"strconv"
	"strings"

	"github.com/napd/napd/gpuvendor"
	"github.com/napd/napd/probes/drm"
)

// Sources a Snapshot can come from.
const (
	SourceNVML = "nvml"
	SourceSMI  = "nvidia-smi"
	SourceDRM  = "drm"
	SourceNone = "none"
)

// Device is one GPU, or one MIG instance of an NVIDIA GPU: each is a device
// of its own to napd. Memory figures are bytes and valid only when
// HaveMemory (some boards, e.g. unified-memory ones, do not report them).
//
// Index is napd's: NVIDIA's devices first, in NVML's order (a GPU in MIG
// mode gives way to its instances, in NVML's order of them), then the other
// vendors' cards in PCI address order; see docs/memory.md.
type Device struct {
	Index  int
	Vendor string // a gpuvendor constant
	UUID   string // NVIDIA's GPU-… or MIG-…; "" for DRM cards
	Name   string
	PCI    string // PCI address of a DRM card ("0000:c1:00.0"); "" from NVML
	// Visible is the device's entry in its vendor's visibility variable:
	// CUDA_VISIBLE_DEVICES's NVML index or MIG UUID, ROCR_VISIBLE_DEVICES's
	// ROCm agent index, ZE_AFFINITY_MASK's Level Zero index.
	Visible string
	// Node is how a container is given it: NVIDIA's CDI device name ("0",
	// "0:1" for MIG instance 1 of GPU 0), a DRM card's render node
	// ("/dev/dri/renderD128").
	Node       string
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
	Source    string // SourceNVML, SourceSMI, SourceDRM, both joined by "+", or SourceNone
	Devices   []Device
	Processes []Process
}

// MIG tells a MIG instance.
func (d Device) MIG() bool { return strings.HasPrefix(d.UUID, "MIG-") }

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

// DRM reads the cards NVIDIA's tools do not measure (drm.Probe; a
// recorded tree in tests).
type DRM interface {
	Read(ctx context.Context) (drm.Reading, error)
}

// Combined is the probe of a host: NVIDIA's devices from NVIDIA (NVML,
// nvidia-smi or None), then the DRM cards after them. Either failing fails
// the snapshot: the DRM cards' indexes follow NVIDIA's count.
type Combined struct {
	NVIDIA Probe
	DRM    DRM
}

// Snapshot implements Probe.
func (c Combined) Snapshot(ctx context.Context) (Snapshot, error) {
	snap, err := c.NVIDIA.Snapshot(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	r, err := c.DRM.Read(ctx)
	if err != nil {
		return Snapshot{}, fmt.Errorf("drm: %w", err)
	}
	if len(r.Cards) == 0 {
		return snap, nil
	}
	switch snap.Source {
	case SourceNone, "":
		snap.Source = SourceDRM
	default:
		snap.Source += "+" + SourceDRM
	}
	base := len(snap.Devices)
	index := make(map[string]int, len(r.Cards))
	amd, intel := 0, 0 // positions among each vendor's cards
	for i, card := range r.Cards {
		d := Device{Index: base + i, Vendor: card.Vendor, Name: card.Model, PCI: card.PCI,
			Total: card.Total, Used: card.Used, HaveMemory: card.HaveUsed}
		if card.Render != "" {
			d.Node = "/dev/dri/" + card.Render
		}
		switch card.Vendor {
		case gpuvendor.AMD:
			n := card.ROCmIndex
			if n < 0 {
				n = amd // no KFD topology: PCI order
			}
			d.Visible = strconv.Itoa(n)
			amd++
		case gpuvendor.Intel:
			d.Visible = strconv.Itoa(intel) // with ZE_ENABLE_PCI_ID_DEVICE_ORDER=1
			intel++
		}
		if d.HaveMemory {
			d.Free = max(d.Total-d.Used, 0)
		}
		index[card.PCI] = d.Index
		snap.Devices = append(snap.Devices, d)
	}
	for _, cl := range r.Clients {
		snap.Processes = append(snap.Processes, Process{PID: cl.PID, GPUIndex: index[cl.PCI], Used: cl.Used, HaveUsed: true})
	}
	return snap, nil
}

// Open picks the best available probe for NVIDIA's GPUs: NVML, else
// nvidia-smi found on PATH (checked with one query), else none; and reads
// every other vendor's cards through the kernel (drm.Host). The returned
// function releases the probe (NVML's Shutdown) and must be called once at
// exit.
func Open(ctx context.Context, logger *slog.Logger) (Probe, func() error) {
	return open(ctx, systemNVML(), drm.Host, logger)
}

func open(ctx context.Context, lib NVML, cards DRM, logger *slog.Logger) (Probe, func() error) {
	if logger == nil {
		logger = slog.Default()
	}
	nv, closeFn := openNVIDIA(ctx, lib, logger)
	r, err := cards.Read(ctx)
	switch {
	case err != nil:
		logger.Warn("gpu probe: the DRM cards cannot be read", "err", err)
	case len(r.Cards) > 0:
		logger.Info("gpu probe", "source", SourceDRM, "cards", len(r.Cards))
	}
	return Combined{NVIDIA: nv, DRM: cards}, closeFn
}

func openNVIDIA(ctx context.Context, lib NVML, logger *slog.Logger) (Probe, func() error) {
	noop := func() error { return nil }
	p, err := OpenNVML(lib)
	if err == nil {
		logger.Info("gpu probe", "source", SourceNVML)
		return p, p.Close
	}
	logger.Info("gpu probe: NVML unavailable", "err", err)
	path, err := exec.LookPath("nvidia-smi")
	if err != nil {
		logger.Info("gpu probe: no nvidia-smi on PATH; no NVIDIA GPUs")
		return None{}, noop
	}
	smi := &SMI{Path: path}
	if _, err := smi.Snapshot(ctx); err != nil {
		logger.Warn("gpu probe: nvidia-smi fails; no NVIDIA GPUs", "path", path, "err", err)
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
