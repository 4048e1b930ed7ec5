package agent

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/gpu"
	"github.com/napd/napd/probes/host"
	"github.com/napd/napd/supervisor"
)

// measurement is one round of probes: host, GPUs, and per model its
// engine's evidence, processes and memory. Published for status and
// metrics; the planner gets a fresh one each round.
type measurement struct {
	at      time.Time
	host    host.Snapshot
	haveMem bool
	// gpus is this round's reading, or the last good one while it is
	// recent (gpuFrom says which); empty when there is neither.
	gpus    gpu.Snapshot
	gpuFrom gpuSource
	gpuNote string        // for refusals when gpuFrom is not gpuLive
	totals  []planner.GPU // device totals of the last reading, for gpuFootprints
	models  map[string]modelMeasure
}

// gpuReadingMaxAge is how long the last good GPU reading stands in for a
// probe that fails; after that, fit-before-wake estimates free memory from
// the learned footprints.
const gpuReadingMaxAge = 15 * time.Second

// gpuSource is where a round's GPU figures come from.
type gpuSource int

const (
	gpuLive       gpuSource = iota // this round's reading
	gpuRecent                      // the probe failed: the last good reading
	gpuFootprints                  // the probe failed for long: estimated from footprints
	gpuUnknown                     // the probe failed and there never was a reading
)

// gpuReadings keeps the last good GPU reading for the rounds whose probe
// fails, and logs when the source of the figures changes. Rounds run at
// once (the planner's and a wake's fit check), hence the mutex.
type gpuReadings struct {
	mu   sync.Mutex
	last gpu.Snapshot
	at   time.Time
	from gpuSource
	err  string // the failure last logged
}

// use fills ms's GPU figures from this round's probe result.
func (r *gpuReadings) use(log *slog.Logger, ms *measurement, g gpu.Snapshot, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		if r.from != gpuLive {
			log.Info("gpu probe works again")
		}
		r.last, r.at, r.from, r.err = g, ms.at, gpuLive, ""
		ms.gpus, ms.gpuFrom = g, gpuLive
		return
	}
	age := ms.at.Sub(r.at).Round(time.Second)
	switch {
	case r.at.IsZero():
		ms.gpuFrom, ms.gpuNote = gpuUnknown, "the GPU probe fails and napd has no reading of the GPUs yet"
	case age <= gpuReadingMaxAge:
		ms.gpus, ms.gpuFrom = r.last, gpuRecent
		ms.gpuNote = fmt.Sprintf("the GPU probe fails; checked against its last reading, %s old, and learned footprints", age)
	default:
		ms.gpuFrom = gpuFootprints
		ms.gpuNote = fmt.Sprintf("the GPU probe fails since %s; free memory estimated from learned footprints", age)
		for _, d := range r.last.Devices {
			if d.HaveMemory {
				ms.totals = append(ms.totals, planner.GPU{Index: d.Index, Total: d.Total, Free: d.Total})
			}
		}
	}
	if ms.gpuFrom != r.from || err.Error() != r.err {
		log.Warn("gpu probe failed", "err", err, "fit_check", ms.gpuNote)
	}
	r.from, r.err = ms.gpuFrom, err.Error()
}

type modelMeasure struct {
	engine   enginemetrics.Evidence
	proc     supervisor.Status
	gpuBytes map[int]int64
	// activity is what the model's evidence says of its engine, detail
	// what it is busy with or what is missing; notes are what status adds
	// to a serving model's reason: the clients that bypass napd, what
	// Ollama holds ("" when nothing).
	activity planner.Engine
	detail   string
	notes    string
}

// measure runs the probes. Engine metrics are scraped only from engines
// that serve: asking a sleeping vLLM anything but its control endpoints is
// not safe.
func (a *Agent) measure(ctx context.Context) *measurement {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ms := &measurement{at: a.clock(), models: make(map[string]modelMeasure)}
	if h, err := a.host.Snapshot(ctx); err == nil {
		ms.host, ms.haveMem = h, true
	} else {
		a.log.Debug("host probe", "err", err)
	}
	g, err := a.gpu.Snapshot(ctx)
	a.gpuReadings.use(a.log, ms, g, err)
	var mu sync.Mutex
	var wg sync.WaitGroup
	pids := make(map[string][]int)
	for _, m := range a.reg.Load().list {
		s := m.Snapshot()
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mm modelMeasure
			if st, err := a.sup.Status(ctx, s.Spec); err == nil {
				mm.proc = st
			}
			switch {
			case !s.Lifecycle.State.Serving():
			case s.Config.Transport == config.TransportZMQ:
				mm.engine = zmqEvidence
			default:
				mm.engine, _ = a.scraper.Scrape(ctx, s.Spec.BaseURL(), s.Config.ActivityMetrics)
			}
			mu.Lock()
			ms.models[m.Name()] = mm
			pids[m.Name()] = mm.proc.PIDs
			mu.Unlock()
		}()
	}
	wg.Wait()
	a.judgeEngines(ms)
	for name, per := range gpu.ModelUsage(pids, ms.gpus.Processes) {
		mm := ms.models[name]
		mm.gpuBytes = per
		ms.models[name] = mm
	}
	a.measured.Store(ms)
	return ms
}

// plannerInput turns a measurement and the models' snapshots into the
// planner's input.
func (a *Agent) plannerInput(ms *measurement) planner.Input {
	cfg := a.cfg.Load()
	in := planner.Input{Now: ms.at, Pressure: cfg.Pressure, GPUNote: ms.gpuNote, GPUUnknown: ms.gpuFrom == gpuUnknown}
	if ms.haveMem {
		in.Host = planner.Host{MemAvailable: ms.host.MemAvailable, HaveMem: true,
			PSISomeAvg10: ms.host.PSI.Some.Avg10, HavePSI: ms.host.HavePSI}
	}
	for _, d := range ms.gpus.Devices {
		if d.HaveMemory {
			in.GPUs = append(in.GPUs, planner.GPU{Index: d.Index, Total: d.Total, Free: d.Free})
		}
	}
	for _, m := range a.reg.Load().list {
		s := m.Snapshot()
		mm := ms.models[m.Name()]
		ev, _ := a.tracker.Evidence(m.Name())
		pm := planner.Model{
			Name: m.Name(), State: s.Lifecycle.State, Pinned: s.Config.Pinned, Sleep: s.Config.Sleep,
			GPUs: a.gpusOf(s), Footprint: a.footprint(s), IdleTimeout: s.Config.IdleTimeout,
			IdleMinimum:    model.PolicyOf(s.Config).IdleMinimum,
			Leases:         planner.Leases{Active: ev.Active, IdleSince: s.Lifecycle.IdleSince(ev)},
			Engine:         mm.activity,
			AllowUntracked: s.Config.AllowUntrackedUnload,
			LastUsed:       s.LastUsed,
			GPUBytes:       mm.gpuBytes,
			YieldAfter:     s.Config.YieldAfter,
			Learned:        s.Learned,
			KeepAwake:      inWindow(s.Config, ms.at),
			Slept:          s.Slept,
			DeepSleep:      s.Config.DeepSleep,
			DeepSleepAfter: s.Config.DeepSleepAfter,
		}
		if s.Lifecycle.State == lifecycle.Sleeping {
			pm.SleptAt = s.Lifecycle.Since
		}
		if s.Lifecycle.State == lifecycle.Unsupported {
			pm.State = lifecycle.Awake // serving; the machine re-checks the proof
		}
		if mm.proc.HaveMemory {
			pm.HostBytes = mm.proc.MemoryBytes
		}
		in.Models = append(in.Models, pm)
	}
	switch ms.gpuFrom {
	case gpuRecent:
		in.Estimate() // the reading may predate a wake
	case gpuFootprints:
		in.GPUs = ms.totals
		in.Estimate()
	}
	return in
}

func lifecycleEngine(e planner.Engine) lifecycle.EngineActivity {
	switch e {
	case planner.EngineIdle:
		return lifecycle.EngineIdle
	case planner.EngineBusy:
		return lifecycle.EngineBusy
	}
	return lifecycle.EngineNoEvidence
}

// plan is one planner round: measure, decide, log each decision once, and
// ask the models concerned to sleep. Footprints of awake models are learned.
func (a *Agent) plan(ctx context.Context) {
	ms := a.measure(ctx)
	in := a.plannerInput(ms)
	if ms.gpuFrom == gpuLive {
		a.learnFootprints(in)
	} else {
		in.GPUs = nil // no sleep for GPU pressure napd cannot see
	}
	res := planner.Plan(in)
	a.act(ms, res.Decisions)
	a.unproven(ms, res.Unproven)
	// Pressure that nothing can relieve is logged when it starts or
	// changes, not every round.
	unrelieved := strings.Join(res.Unrelieved, "; ")
	if unrelieved != a.unrelieved {
		if unrelieved != "" {
			a.log.Warn("memory pressure not relieved", "why", unrelieved)
		} else {
			a.log.Info("memory pressure relieved")
		}
		a.unrelieved = unrelieved
	}
}

// act asks each decided model to sleep; the lifecycle has the last word.
func (a *Agent) act(ms *measurement, decisions []planner.Decision) {
	reg := a.reg.Load()
	for _, d := range decisions {
		m := reg.byName[d.Model]
		if m == nil {
			continue
		}
		reason := sleepReason(d.Reason)
		a.log.Info("planner decision", "model", d.Model, "decision", d)
		a.metrics.Decisions.WithLabelValues(d.Model, string(d.Action), string(d.Reason)).Inc()
		if reason == lifecycle.Demand {
			a.metrics.Swaps.WithLabelValues(d.Model, string(d.Reason)).Inc()
		}
		a.publishEvent(controlDecision(d))
		if m.Snapshot().Lifecycle.State == lifecycle.Sleeping {
			m.Deepen(d.Strategy, string(d.Reason)) // the sleep ladder, or host pressure
			continue
		}
		req := lifecycle.SleepRequest{Reason: reason, Strategy: d.Strategy, Cause: string(d.Reason)}
		mm := ms.models[d.Model]
		m.RequestSleep(req, lifecycleEngine(mm.activity), mm.detail)
	}
}

// unproven hands the lifecycle the idle sleep of models whose idleness
// cannot be proven: it declines it and marks them unsupported, saying
// what is missing.
func (a *Agent) unproven(ms *measurement, names []string) {
	reg := a.reg.Load()
	for _, name := range names {
		if m := reg.byName[name]; m != nil {
			m.RequestSleep(lifecycle.SleepRequest{Reason: lifecycle.IdleTimeout, Cause: string(planner.ReasonIdle)},
				lifecycle.EngineNoEvidence, ms.models[name].detail)
		}
	}
}

// learnFootprints remembers what awake models hold on their GPUs, so the
// next wake's fit check knows their size.
func (a *Agent) learnFootprints(in planner.Input) {
	for _, m := range in.Models {
		if m.State != lifecycle.Awake || len(m.GPUBytes) == 0 {
			continue
		}
		var sum int64
		for _, b := range m.GPUBytes {
			sum += b
		}
		old, ok := a.footprints.Get(m.Name)
		if ok && old == sum {
			continue
		}
		if !ok {
			a.log.Info("footprint measured", "model", m.Name, "bytes", sum, "replaces", m.Footprint)
		}
		if err := a.footprints.Remember(m.Name, sum); err != nil {
			a.log.Warn("remembering footprint", "model", m.Name, "err", err)
		}
	}
}

// metricsSnapshot feeds the scrape-time gauges.
func (a *Agent) metricsSnapshot() metrics.Snapshot {
	ms := a.measured.Load()
	snap := metrics.Snapshot{HostAvailable: -1}
	for _, m := range a.reg.Load().list {
		s := m.Snapshot()
		ev, _ := a.tracker.Evidence(m.Name())
		mm := metrics.Model{Name: m.Name(), State: s.Lifecycle.State, QueueDepth: s.QueueDepth, Leases: ev.Active, EngineBytes: -1}
		if ms != nil {
			if me, ok := ms.models[m.Name()]; ok {
				if me.proc.HaveMemory {
					mm.EngineBytes = me.proc.MemoryBytes
				}
				mm.GPUBytes = gpuBytesByIndex(me.gpuBytes)
			}
		}
		snap.Models = append(snap.Models, mm)
	}
	if ms != nil {
		if ms.haveMem {
			snap.HostAvailable = ms.host.MemAvailable
			snap.HavePSI, snap.PSISomeAvg10 = ms.host.HavePSI, ms.host.PSI.Some.Avg10
		}
		for _, d := range ms.gpus.Devices {
			if d.HaveMemory {
				snap.GPUs = append(snap.GPUs, metrics.GPU{Index: strconv.Itoa(d.Index), Total: d.Total, Used: d.Used})
			}
		}
	}
	return snap
}

// gpuBytesByIndex renders per-GPU bytes with string keys for JSON.
func gpuBytesByIndex(per map[int]int64) map[string]int64 {
	if len(per) == 0 {
		return nil
	}
	out := make(map[string]int64, len(per))
	for g, b := range per {
		out[strconv.Itoa(g)] = b
	}
	return out
}
