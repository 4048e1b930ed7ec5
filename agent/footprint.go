package agent

import (
	"slices"
	"strings"
	"sync"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/estimate"
	"github.com/napd/napd/agent/model"
)

// footprintInfo is a model's expected GPU memory and its source; From says
// what an estimate was made from.
type footprintInfo struct {
	Bytes  int64
	Source control.FootprintSource
	From   string
}

// estimates caches the first-load estimates from model files (a directory
// is not read every planning round) by model and command, and remembers
// which estimates were logged.
type estimates struct {
	mu     sync.Mutex
	files  map[string]fileEstimate
	logged map[string]int64
}

type fileEstimate struct {
	command string
	est     estimate.Estimate
}

// footprint is a model's expected GPU memory: configured, else measured
// (learned), else estimated before its first wake; 0 = unknown.
func (a *Agent) footprint(s model.Snapshot) int64 { return a.footprintOf(s).Bytes }

func (a *Agent) footprintOf(s model.Snapshot) footprintInfo {
	c := s.Config
	if c.GPUMemory > 0 {
		return footprintInfo{Bytes: c.GPUMemory, Source: control.FootprintConfigured}
	}
	if b, ok := a.footprints.Get(c.Name); ok {
		return footprintInfo{Bytes: b, Source: control.FootprintMeasured}
	}
	e := estimate.FromUtilization(c.Command, a.gpuTotal(c, a.gpusOf(s)))
	if e.Bytes == 0 {
		e = a.fileEstimate(c)
	}
	if e.Bytes == 0 {
		return footprintInfo{}
	}
	a.estimates.mu.Lock()
	if a.estimates.logged[c.Name] != e.Bytes {
		a.estimates.logged[c.Name] = e.Bytes
		a.log.Info("footprint estimated", "model", c.Name, "bytes", e.Bytes, "from", e.From)
	}
	a.estimates.mu.Unlock()
	return footprintInfo{Bytes: e.Bytes, Source: control.FootprintEstimated, From: e.From}
}

func (a *Agent) fileEstimate(c *config.Model) estimate.Estimate {
	cmd := strings.Join(c.Command, "\x00")
	a.estimates.mu.Lock()
	defer a.estimates.mu.Unlock()
	if f, ok := a.estimates.files[c.Name]; ok && f.command == cmd {
		return f.est
	}
	e := estimate.FromFiles(c.Command)
	a.estimates.files[c.Name] = fileEstimate{command: cmd, est: e}
	return e
}

// gpuTotal is the total memory of the GPUs a model runs on, from the last
// good reading: for a placed model not placed yet, count × the largest GPU.
func (a *Agent) gpuTotal(c *config.Model, gpus []int) int64 {
	a.gpuReadings.mu.Lock()
	devs := a.gpuReadings.last.Devices
	a.gpuReadings.mu.Unlock()
	var total, largest int64
	for _, d := range devs {
		if !d.HaveMemory {
			continue
		}
		largest = max(largest, d.Total)
		if slices.Contains(gpus, d.Index) {
			total += d.Total
		}
	}
	if len(gpus) == 0 && c.GPUCount > 0 {
		return largest * int64(c.GPUCount)
	}
	return total
}
