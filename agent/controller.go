package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor/process"
	"github.com/napd/napd/supervisor/systemd"
)

// The Agent is the control API's Controller.
var _ control.Controller = (*Agent)(nil)

func (a *Agent) model(name string) (*model, error) {
	m, ok := a.reg.Load().resolve(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q", control.ErrNotFound, name)
	}
	return m, nil
}

// Status implements control.Controller.
func (a *Agent) Status() control.Status {
	cfg := a.cfg.Load()
	st := control.Status{Version: a.opts.Version, Supervisor: a.backend.Name(), Config: cfg.Path, Started: a.started}
	ms := a.measured.Load()
	if ms != nil {
		if ms.haveMem {
			st.Host = control.HostMemory{TotalBytes: ms.host.MemTotal, AvailableBytes: ms.host.MemAvailable}
			if ms.host.HavePSI {
				v := ms.host.PSI.Some.Avg10
				st.Host.PSISomeAvg10 = &v
			}
		}
		for _, d := range ms.gpus.Devices {
			st.GPUs = append(st.GPUs, control.GPUMemory{Index: d.Index, Name: d.Name, TotalBytes: d.Total, UsedBytes: d.Used, FreeBytes: d.Free})
		}
	}
	for _, m := range a.reg.Load().list {
		s := m.snap.Load()
		ev, _ := a.tracker.Evidence(m.name)
		row := control.ModelStatus{
			Name: m.name, Aliases: s.cfg.Aliases, State: s.lc.State.String(), Reason: s.lc.Reason, StateSince: s.lc.Since,
			Port: s.spec.Port, Transport: s.cfg.Transport, Sleep: s.cfg.Sleep, Pinned: s.cfg.Pinned,
			Leases: ev.Active, QueueDepth: s.queueDepth, LastWakeMs: s.lc.LastWake.Milliseconds(),
			Attempts: s.lc.Attempts, Footprint: a.footprint(s.cfg),
		}
		if a.backend.Name() == config.SupervisorSystemd {
			row.Unit = s.spec.UnitName()
		}
		if ev.Active == 0 && !ev.Since.IsZero() {
			since := ev.Since
			row.IdleSince = &since
		}
		if ms != nil {
			if mm, ok := ms.models[m.name]; ok {
				if mm.proc.HaveMemory {
					b := mm.proc.MemoryBytes
					row.EngineBytes = &b
				}
				row.GPUBytes = gpuBytesByIndex(mm.gpuBytes)
			}
		}
		st.Models = append(st.Models, row)
	}
	return st
}

// Wake implements control.Controller: an operator wake is an arrival with
// no request behind it, holding a lease while it waits so the planner
// leaves the model alone.
func (a *Agent) Wake(ctx context.Context, name string, progress func(string)) error {
	m, err := a.model(name)
	if err != nil {
		return err
	}
	progress(m.snap.Load().lc.State.String())
	events, cancel := a.hub.subscribe()
	defer cancel()
	done := make(chan error, 1)
	go func() {
		t, err := m.admit(ctx, gateway.Admission{Model: m.name, Client: "napctl", Kind: lease.KindOther})
		if err == nil {
			t.Done(gateway.Outcome{})
		}
		done <- err
	}()
	for {
		select {
		case err := <-done:
			var r *gateway.Refusal
			if errors.As(err, &r) {
				return errors.New(r.Message)
			}
			return err
		case e := <-events:
			if e.Model == m.name && e.Kind == "state" {
				progress(e.To)
			}
		}
	}
}

// Sleep implements control.Controller. An operator sleep drains live
// leases first; "" means the model's own strategy.
func (a *Agent) Sleep(ctx context.Context, name, strategy string) error {
	m, err := a.model(name)
	if err != nil {
		return err
	}
	if strategy == "" {
		strategy = m.snap.Load().cfg.Sleep
	}
	switch strategy {
	case config.SleepStop, config.SleepVLLML1, config.SleepVLLML2, config.SleepSGLang:
	case config.SleepNone:
		return fmt.Errorf("sleep %s: strategy %q never puts a model to sleep", name, strategy)
	default:
		return fmt.Errorf("sleep %s: unknown strategy %q", name, strategy)
	}
	events, cancel := a.hub.subscribe()
	defer cancel()
	var d lifecycle.Decision
	m.call(func() {
		d = m.requestSleep(lifecycle.SleepRequest{Reason: lifecycle.Operator, Strategy: strategy}, lifecycle.EngineNoEvidence)
	})
	if d.Action == lifecycle.Declined {
		return fmt.Errorf("sleep %s: %s", name, d.Reason)
	}
	if m.snap.Load().lc.State == lifecycle.Sleeping {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-events:
			if e.Model != m.name || e.Kind != "state" {
				continue
			}
			switch e.To {
			case lifecycle.Sleeping.String():
				return nil
			case lifecycle.Draining.String(), lifecycle.Waking.String():
			default:
				return fmt.Errorf("sleep %s: %s", name, e.Reason)
			}
		}
	}
}

// Reset implements control.Controller.
func (a *Agent) Reset(name string) error {
	m, err := a.model(name)
	if err != nil {
		return err
	}
	m.call(func() {
		m.machine.Reset(m.now())
		m.noteState()
		m.publish()
	})
	return nil
}

// Logs implements control.Controller: the exec backend keeps each
// engine's output under state_dir/logs; under systemd it is in the
// journal of the engine's unit. napd itself never logs engine output.
func (a *Agent) Logs(name string, lines int) ([]string, error) {
	m, err := a.model(name)
	if err != nil {
		return nil, err
	}
	switch b := a.backend.(type) {
	case *process.Backend:
		return b.Tail(m.name, lines)
	case *systemd.Backend:
		return nil, fmt.Errorf("the output of %s is in the journal: journalctl -u %s", m.name, m.snap.Load().spec.UnitName())
	}
	return nil, fmt.Errorf("the %s backend keeps no engine output", a.backend.Name())
}

// Subscribe implements control.Controller.
func (a *Agent) Subscribe() (<-chan control.Event, func()) { return a.hub.subscribe() }

// controlDecision is a planner decision as an event.
func controlDecision(d planner.Decision) control.Event {
	return control.Event{Time: time.Now(), Model: d.Model, Kind: "decision", Reason: d.Message}
}
