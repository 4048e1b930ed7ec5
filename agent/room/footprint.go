package room

import (
	"slices"
	"strings"
	"sync"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/estimate"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
)

// Footprint is a model's expected GPU memory and where it comes from;
// From says what an estimate was made from.
type Footprint struct {
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

// Footprint is a model's expected GPU memory, for status: configured, else
// measured (learned), else estimated before its first wake; 0 = unknown.
func (d *Desk) Footprint(s model.Snapshot) Footprint { return d.footprintOf(s, d.Measured()) }

// footprint is the bytes of footprintOf.
func (d *Desk) footprint(s model.Snapshot, ms *measure.Measurement) int64 {
	return d.footprintOf(s, ms).Bytes
}

// footprintOf estimates from the GPUs' size as ms (nil: none yet) read it.
// vLLM's utilization flag wins over the model files: vLLM takes that share
// whatever the weights.
func (d *Desk) footprintOf(s model.Snapshot, ms *measure.Measurement) Footprint {
	c := s.Config
	if c.GPUMemory > 0 {
		return Footprint{Bytes: c.GPUMemory, Source: control.FootprintConfigured}
	}
	if b, ok := d.d.Footprints.Get(c.Name); ok {
		return Footprint{Bytes: b, Source: control.FootprintMeasured}
	}
	e := estimate.FromUtilization(c.Command, gpuTotal(ms, c, d.GPUs(s)))
	if e.Bytes == 0 {
		e = d.fileEstimate(c)
	}
	if e.Bytes == 0 {
		return Footprint{}
	}
	d.estimates.mu.Lock()
	if d.estimates.logged[c.Name] != e.Bytes {
		d.estimates.logged[c.Name] = e.Bytes
		d.d.Log.Info("footprint estimated", "model", c.Name, "bytes", e.Bytes, "from", e.From)
	}
	d.estimates.mu.Unlock()
	return Footprint{Bytes: e.Bytes, Source: control.FootprintEstimated, From: e.From}
}

func (d *Desk) fileEstimate(c *config.Model) estimate.Estimate {
	cmd := strings.Join(c.Command, "\x00")
	d.estimates.mu.Lock()
	defer d.estimates.mu.Unlock()
	if f, ok := d.estimates.files[c.Name]; ok && f.command == cmd {
		return f.est
	}
	e := estimate.FromFiles(c.Command)
	d.estimates.files[c.Name] = fileEstimate{command: cmd, est: e}
	return e
}

// gpuTotal is the total memory of the GPUs a model runs on, from the last
// good reading: for a placed model not placed yet, count × the largest GPU.
func gpuTotal(ms *measure.Measurement, c *config.Model, gpus []int) int64 {
	if ms == nil {
		return 0
	}
	var total, largest int64
	for _, g := range ms.Totals {
		largest = max(largest, g.Total)
		if slices.Contains(gpus, g.Index) {
			total += g.Total
		}
	}
	if len(gpus) == 0 && c.GPUCount > 0 {
		return largest * int64(c.GPUCount)
	}
	return total
}

// learnFootprints remembers what awake models hold on their GPUs, so the
// next wake's fit check knows their size.
func (d *Desk) learnFootprints(in planner.Input) {
	for _, m := range in.Models {
		if m.State != lifecycle.Awake || len(m.GPUBytes) == 0 {
			continue
		}
		var sum int64
		for _, b := range m.GPUBytes {
			sum += b
		}
		old, ok := d.d.Footprints.Get(m.Name)
		if ok && old == sum {
			continue
		}
		if !ok {
			d.d.Log.Info("footprint measured", "model", m.Name, "bytes", sum, "replaces", m.Footprint)
		}
		if err := d.d.Footprints.Remember(m.Name, sum); err != nil {
			d.d.Log.Warn("remembering footprint", "model", m.Name, "err", err)
		}
	}
}
