//go:build linux

// Package host measures the host's memory: total and available RAM (through
// gopsutil) and memory pressure stall information from /proc/pressure/memory.
//
// It only measures: it must not act on what it reads, and it owns no
// goroutine.
package host

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/shirou/gopsutil/v4/mem"
)

// DefaultPSIPath is where the kernel publishes memory PSI.
const DefaultPSIPath = "/proc/pressure/memory"

// Snapshot is one reading of the host's memory.
type Snapshot struct {
	MemTotal     int64 // bytes
	MemAvailable int64 // bytes
	// PSI is valid only when HavePSI: kernels without CONFIG_PSI (or with
	// psi=0) have no pressure file, which is "no PSI", not an error.
	PSI     PSI
	HavePSI bool
}

// Probe reads the host's memory.
type Probe interface {
	Snapshot(ctx context.Context) (Snapshot, error)
}

// Reader is the Probe of the running host.
type Reader struct {
	// PSIPath is the memory PSI file; "" means DefaultPSIPath.
	PSIPath string
	// VirtualMemory reads MemTotal/MemAvailable; nil means gopsutil's
	// mem.VirtualMemoryWithContext. Tests replace it.
	VirtualMemory func(ctx context.Context) (*mem.VirtualMemoryStat, error)
}

// Snapshot implements Probe.
func (r *Reader) Snapshot(ctx context.Context) (Snapshot, error) {
	vm := r.VirtualMemory
	if vm == nil {
		vm = mem.VirtualMemoryWithContext
	}
	st, err := vm(ctx)
	if err != nil {
		return Snapshot{}, fmt.Errorf("host memory: %w", err)
	}
	snap := Snapshot{MemTotal: int64(st.Total), MemAvailable: int64(st.Available)}
	snap.PSI, snap.HavePSI, err = ReadPSI(r.psiPath())
	if err != nil {
		return Snapshot{}, err
	}
	return snap, nil
}

func (r *Reader) psiPath() string {
	if r.PSIPath == "" {
		return DefaultPSIPath
	}
	return r.PSIPath
}

// ReadPSI reads and parses a PSI file. A missing file (no PSI support) gives
// ok == false and no error. Some kernels expose the file but refuse to read
// it when PSI is disabled at boot (EOPNOTSUPP); that is "no PSI" too.
func ReadPSI(path string) (psi PSI, ok bool, err error) {
	text, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EOPNOTSUPP) {
		return PSI{}, false, nil
	}
	if err != nil {
		return PSI{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	psi, err = ParsePSI(text)
	if err != nil {
		return PSI{}, false, fmt.Errorf("%s: %w", path, err)
	}
	return psi, true, nil
}
