package room

import (
	"context"
	"strings"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/agent/priority"
)

// Plan is the planner's periodic round, called by napd's ticker: measure,
// decide (idle timeouts, memory pressure, the sleep ladder), log each
// decision once, and ask the models concerned to sleep; footprints of
// awake models are learned, and the models whose keep_awake window
// started since the last round are woken when they fit. One caller at a
// time.
func (d *Desk) Plan(ctx context.Context) {
	models := d.d.Models()
	ms := d.measure(ctx, models)
	in := d.input(ms, models)
	if ms.GPUFrom == measure.GPULive {
		d.learnFootprints(in)
	} else {
		in.GPUs = nil // no sleep for GPU pressure napd cannot see
	}
	res := planner.Plan(in)
	d.act(ms, models, res.Decisions)
	d.unproven(ms, models, res.Unproven)
	// Pressure that nothing can relieve is logged when it starts or
	// changes, not every round.
	if unrelieved := strings.Join(res.Unrelieved, "; "); unrelieved != d.unrelieved {
		if unrelieved != "" {
			d.d.Log.Warn("memory pressure not relieved", "why", unrelieved)
		} else {
			d.d.Log.Info("memory pressure relieved")
		}
		d.unrelieved = unrelieved
	}
	d.windowsStarted(ctx, ms.At)
}

// input turns a measurement and the models' snapshots into the planner's
// input.
func (d *Desk) input(ms *measure.Measurement, models []Model) planner.Input {
	cfg := d.d.Config()
	in := planner.Input{Now: ms.At, Pressure: cfg.Pressure, GPUNote: ms.GPUNote, GPUUnknown: ms.GPUFrom == measure.GPUUnknown,
		Classes: cfg.Policy.Priorities, PriorityAge: cfg.Policy.PriorityAge, ClassYieldAfter: classYields(cfg.Policy)}
	if ms.HaveMem {
		in.Host = planner.Host{MemAvailable: ms.Host.MemAvailable, HaveMem: true,
			PSISomeAvg10: ms.Host.PSI.Some.Avg10, HavePSI: ms.Host.HavePSI}
	}
	for _, g := range ms.GPUs.Devices {
		if g.HaveMemory {
			in.GPUs = append(in.GPUs, measure.PlannerGPU(g))
		}
	}
	for _, m := range models {
		s := m.Snapshot()
		mm := ms.Models[m.Name()]
		ev := d.d.Leases(m.Name())
		pm := planner.Model{
			Name: m.Name(), State: s.Lifecycle.State, Pinned: s.Config.Pinned, Sleep: s.Config.Sleep,
			GPUs: d.GPUs(s), Footprint: d.footprint(s, ms), IdleTimeout: s.Config.IdleTimeout,
			IdleMinimum:    model.PolicyOf(s.Config).IdleMinimum,
			Leases:         planner.Leases{Active: ev.Active, IdleSince: ms.IdleSince(m.Name(), s.Lifecycle, ev)},
			Engine:         mm.Activity,
			AllowUntracked: s.Config.AllowUntrackedUnload,
			LastUsed:       s.LastUsed,
			Serving:        s.Serving,
			Recent:         s.Recent,
			GPUBytes:       mm.GPUBytes,
			YieldAfter:     s.Config.YieldAfter,
			Learned:        s.Learned,
			KeepAwake:      s.Config.InWindow(ms.At),
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
		if s.Lifecycle.State.Serving() && s.Lifecycle.Since.After(ms.At) {
			// It turned serving after the measurement began, which did
			// not scrape it then: its evidence is judged at the next
			// round, as a waking model's is, not taken as none (a holder
			// whose idleness cannot be proven, which a waiter would be
			// refused behind).
			pm.State = lifecycle.Waking
		}
		if mm.Proc.HaveMemory {
			pm.HostBytes = mm.Proc.MemoryBytes
		}
		in.Models = append(in.Models, pm)
	}
	switch ms.GPUFrom {
	case measure.GPURecent:
		in.Estimate() // the reading may predate a wake
	case measure.GPUFootprints:
		in.GPUs = ms.Totals
		in.Estimate()
	}
	return in
}

// classYields is [policy] priority_yield_after by class.
func classYields(p config.Policy) map[priority.Class]time.Duration {
	out := make(map[priority.Class]time.Duration, len(p.PriorityYieldAfter))
	for name, d := range p.PriorityYieldAfter {
		if c, ok := p.Priorities.Of(name); ok {
			out[c] = d
		}
	}
	return out
}

// act asks each decided model to sleep; the lifecycle has the last word.
func (d *Desk) act(ms *measure.Measurement, models []Model, decisions []planner.Decision) {
	for _, dec := range decisions {
		m := find(models, dec.Model)
		if m == nil {
			continue
		}
		reason := sleepReason(dec.Reason)
		d.d.Log.Info("planner decision", "model", dec.Model, "decision", dec)
		d.d.Metrics.Decisions.WithLabelValues(dec.Model, string(dec.Action), string(dec.Reason)).Inc()
		if reason == lifecycle.Demand {
			d.d.Metrics.Swaps.WithLabelValues(dec.Model, string(dec.Reason)).Inc()
		}
		d.d.Emit(control.Event{Time: d.d.Clock(), Model: dec.Model, Kind: control.EventDecision, Reason: dec.Message})
		if m.Snapshot().Lifecycle.State == lifecycle.Sleeping {
			m.Deepen(dec.Strategy, string(dec.Reason)) // the sleep ladder, or host pressure
			continue
		}
		req := lifecycle.SleepRequest{Reason: reason, Strategy: dec.Strategy, Cause: string(dec.Reason)}
		mm := ms.Models[dec.Model]
		m.RequestSleep(req, lifecycle.Evidence{Engine: lifecycleEngine(mm.Activity), Detail: mm.Detail, ActiveAt: mm.ActiveAt})
	}
}

// unproven hands the lifecycle the idle sleep of models whose idleness
// cannot be proven: it declines it and marks them unsupported, saying
// what is missing.
func (d *Desk) unproven(ms *measure.Measurement, models []Model, names []string) {
	for _, name := range names {
		if m := find(models, name); m != nil {
			mm := ms.Models[name]
			m.RequestSleep(lifecycle.SleepRequest{Reason: lifecycle.IdleTimeout, Cause: string(planner.ReasonIdle)},
				lifecycle.Evidence{Engine: lifecycle.EngineNoEvidence, Detail: mm.Detail, ActiveAt: mm.ActiveAt})
		}
	}
}

// sleepReason maps a planner decision onto the lifecycle's sleep reason.
func sleepReason(r planner.Reason) lifecycle.SleepReason {
	switch r {
	case planner.ReasonIdle:
		return lifecycle.IdleTimeout
	case planner.ReasonMakeRoom, planner.ReasonYield, planner.ReasonMaxAwake:
		return lifecycle.Demand
	}
	return lifecycle.MemoryPressure
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
