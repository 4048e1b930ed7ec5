// Package measure runs napd's probes over the models: host memory and
// PSI, the GPUs (with a fallback when their probe fails), and per model its
// engine's processes, memory and activity evidence (its own metrics, the
// clients connected to its port). A Measurement is what one round found;
// the make-room desk (agent/room) turns it into the planner's input.
//
// It owns the probes' use and the last good GPU reading. It decides
// nothing: what a model's evidence says of its engine is a reading, and
// every sleep or wake is decided elsewhere.
package measure

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/gpu"
	"github.com/napd/napd/probes/host"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

// Measurement is one round of probes: host, GPUs, and per model its
// engine's evidence, processes and memory. The planner gets a fresh one
// each round; status and metrics read the last.
type Measurement struct {
	// At is when the round began: a reading is no newer than that.
	At      time.Time
	Host    host.Snapshot
	HaveMem bool
	// GPUs is this round's reading, or the last good one while it is
	// recent (GPUFrom says which); empty when there is neither.
	GPUs    gpu.Snapshot
	GPUFrom GPUSource
	GPUNote string // for refusals when GPUFrom is not GPULive
	// Totals are the device totals of the last good reading (Free =
	// Total), whatever this round's source: for estimates from
	// footprints and from the GPUs' size.
	Totals []planner.GPU
	Models map[string]Model
}

// GPUSource is where a round's GPU figures come from.
type GPUSource int

// GPU sources.
const (
	GPULive       GPUSource = iota // this round's reading
	GPURecent                      // the probe failed: the last good reading
	GPUFootprints                  // the probe failed for long: estimated from footprints
	GPUUnknown                     // the probe failed and there never was a reading
)

// Model is what a round found of one model.
type Model struct {
	Engine   enginemetrics.Evidence
	Proc     supervisor.Status
	GPUBytes map[int]int64
	// Activity is what the model's evidence says of its engine, Detail
	// what it is busy with or what is missing; Notes are what status adds
	// to a serving model's reason: the clients that bypass napd, what
	// Ollama holds ("" when nothing).
	Activity planner.Engine
	Detail   string
	Notes    string
	// ActiveAt is when a round last saw the engine at work, by any
	// evidence beside napd's leases (busy, clients outside napd, work
	// counters that moved since the round before); zero when none did
	// since it serves. Idle time counts from the later of it and the
	// model's own last use (IdleSince).
	ActiveAt time.Time
}

// IdleSince is when a model was last in use by any evidence napd has: the
// lifecycle's idle since (its last lease's end or its last wake, from its
// lease evidence) or the last time its engine was seen at work, whichever
// is later. ms may be nil (nothing measured yet).
func (ms *Measurement) IdleSince(name string, lc lifecycle.Snapshot, leases lease.Evidence) time.Time {
	since := lc.IdleSince(leases)
	if ms != nil {
		if at := ms.Models[name].ActiveAt; at.After(since) {
			since = at
		}
	}
	return since
}

// GPUReadingMaxAge is how long the last good GPU reading stands in for a
// probe that fails; after that, fit-before-wake estimates free memory from
// the learned footprints.
const GPUReadingMaxAge = 15 * time.Second

// Supervisor is what a round asks the engine supervisor
// (*supervisor.Supervisor in napd).
type Supervisor interface {
	Status(ctx context.Context, spec supervisor.Spec) (supervisor.Status, error)
	Probe(ctx context.Context, spec supervisor.Spec) error
	// SleepsByItself asks an engine that sleeps by itself (llama.cpp's
	// idle sleep) whether it does now; false for the others.
	SleepsByItself(ctx context.Context, spec supervisor.Spec) (bool, error)
}

// Prober runs the rounds. Rounds may run at once (the planner's and a
// wake's fit check); a Prober is safe for concurrent use.
type Prober struct {
	Host       host.Probe
	GPU        gpu.Probe
	Scraper    *enginemetrics.Scraper
	Supervisor Supervisor
	Clock      func() time.Time
	Log        *slog.Logger
	readings   gpuReadings
	active     lastActivity
}

// probeTimeout bounds one round's probes.
const probeTimeout = 3 * time.Second

// Measure runs the probes for the models in snaps. Engine metrics are
// scraped only from engines that serve: asking a sleeping vLLM anything
// but its control endpoints is not safe.
func (p *Prober) Measure(ctx context.Context, snaps []model.Snapshot) *Measurement {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	ms := &Measurement{At: p.Clock(), Models: make(map[string]Model, len(snaps))}
	if h, err := p.Host.Snapshot(ctx); err == nil {
		ms.Host, ms.HaveMem = h, true
	} else {
		p.Log.Debug("host probe", "err", err)
	}
	g, err := p.GPU.Snapshot(ctx)
	p.readings.use(p.Log, ms, g, err)
	var mu sync.Mutex
	var wg sync.WaitGroup
	pids := make(map[string][]int, len(snaps))
	for _, s := range snaps {
		wg.Go(func() {
			var mm Model
			if st, err := p.Supervisor.Status(ctx, s.Spec); err == nil {
				mm.Proc = st
			}
			switch {
			case !s.Lifecycle.State.Serving():
			case s.Config.Transport == config.TransportZMQ:
				mm.Engine = zmqEvidence
			default:
				mm.Engine, _ = p.scrape(ctx, s.Spec, s.Config)
			}
			mu.Lock()
			ms.Models[s.Config.Name] = mm
			pids[s.Config.Name] = mm.Proc.PIDs
			mu.Unlock()
		})
	}
	wg.Wait()
	p.judgeEngines(ms, snaps)
	for name, per := range gpu.ModelUsage(pids, ms.GPUs.Processes) {
		mm := ms.Models[name]
		mm.GPUBytes = per
		ms.Models[name] = mm
	}
	return ms
}

// scrape reads an engine's evidence: quietly (no endpoint that is work
// to it) when it sleeps by itself, which a scrape must neither wake nor
// keep awake.
func (p *Prober) scrape(ctx context.Context, spec supervisor.Spec, cfg *config.Model) (enginemetrics.Evidence, error) {
	if cfg.Sleep == sleepmode.LlamaCpp {
		return p.Scraper.ScrapeQuiet(ctx, spec.BaseURL(), cfg.ActivityMetrics)
	}
	return p.Scraper.Scrape(ctx, spec.BaseURL(), cfg.ActivityMetrics)
}

// zmqEvidence is the engine evidence of a serving ZMQ worker. A worker
// serves one napd session at a time, so every request it runs came through
// the gateway and holds a lease: the leases are the whole truth, and the
// engine adds nothing to them.
var zmqEvidence = enginemetrics.Evidence{Engine: enginemetrics.EngineWorker, Counts: true}

// gpuReadings keeps the last good GPU reading for the rounds whose probe
// fails, and logs when the source of the figures changes.
type gpuReadings struct {
	mu     sync.Mutex
	last   gpu.Snapshot
	totals []planner.GPU // of last
	at     time.Time
	from   GPUSource
	err    string // the failure last logged
}

// use fills ms's GPU figures from this round's probe result.
func (r *gpuReadings) use(log *slog.Logger, ms *Measurement, g gpu.Snapshot, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		if r.from != GPULive {
			log.Info("gpu probe works again")
		}
		r.last, r.at, r.from, r.err = g, ms.At, GPULive, ""
		r.totals = nil
		for _, d := range g.Devices {
			if d.HaveMemory {
				t := PlannerGPU(d)
				t.Free = d.Total
				r.totals = append(r.totals, t)
			}
		}
		ms.GPUs, ms.GPUFrom, ms.Totals = g, GPULive, r.totals
		return
	}
	ms.Totals = r.totals
	age := ms.At.Sub(r.at).Round(time.Second)
	switch {
	case r.at.IsZero():
		ms.GPUFrom, ms.GPUNote = GPUUnknown, "the GPU probe fails and napd has no reading of the GPUs yet"
	case age <= GPUReadingMaxAge:
		ms.GPUs, ms.GPUFrom = r.last, GPURecent
		ms.GPUNote = fmt.Sprintf("the GPU probe fails; checked against its last reading, %s old, and learned footprints", age)
	default:
		ms.GPUFrom = GPUFootprints
		ms.GPUNote = fmt.Sprintf("the GPU probe fails since %s; free memory estimated from learned footprints", age)
	}
	if ms.GPUFrom != r.from || err.Error() != r.err {
		log.Warn("gpu probe failed", "err", err, "fit_check", ms.GPUNote)
	}
	r.from, r.err = ms.GPUFrom, err.Error()
}

// PlannerGPU is a device as the planner sees it.
func PlannerGPU(d gpu.Device) planner.GPU {
	return planner.GPU{Index: d.Index, Total: d.Total, Free: d.Free, Vendor: d.Vendor, Alone: d.MIG()}
}

// GPUDevices are napd's GPU indexes as the vendors' runtimes know them, in
// the last good reading: nil when there is none or it lacks one of them.
func (p *Prober) GPUDevices(gpus []int) []supervisor.GPU {
	p.readings.mu.Lock()
	last := p.readings.last
	p.readings.mu.Unlock()
	out := make([]supervisor.GPU, 0, len(gpus))
	for _, i := range gpus {
		d, ok := last.Device(i)
		if !ok {
			return nil
		}
		out = append(out, supervisor.GPU{Vendor: d.Vendor, ID: d.Visible, Node: d.Node})
	}
	return out
}
