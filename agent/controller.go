package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
)

// The Agent is the control API's Controller.
var _ control.Controller = (*Agent)(nil)

func (a *Agent) model(name string) (*model.Model, error) {
	m, ok := a.reg.Load().resolve(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q", control.ErrNotFound, name)
	}
	return m, nil
}

// Status implements control.Controller.
func (a *Agent) Status() control.Status {
	cfg := a.cfg.Load()
	st := control.Status{Version: a.opts.Version, Supervisor: a.sup.Name(), Config: cfg.Path, Started: a.started}
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
		s := m.Snapshot()
		ev, _ := a.tracker.Evidence(m.Name())
		row := control.ModelStatus{
			Name: m.Name(), Aliases: s.Config.Aliases, State: s.Lifecycle.State.String(), Reason: a.reason(m.Name(), s.Lifecycle),
			StateSince: s.Lifecycle.Since, Port: s.Spec.Port, Transport: string(s.Config.Transport), Sleep: s.Config.Sleep, Pinned: s.Config.Pinned,
			Leases: ev.Active, QueueDepth: s.QueueDepth, LastWakeMs: s.Lifecycle.LastWake.Milliseconds(),
			Attempts: s.Lifecycle.Attempts,
			Unit:     a.sup.UnitName(s.Spec), GPUs: a.gpusOf(s), Placement: a.placedWhy(m.Name()),
			SleptWith: s.Slept,
		}
		fp := a.footprintOf(s)
		row.Footprint, row.FootprintSource, row.FootprintFrom = fp.Bytes, fp.Source, fp.From
		if holders := a.room.waitingFor(m.Name()); holders != "" {
			row.RoomWaiting, row.WaitingFor = s.QueueDepth, holders
		}
		if since := s.Lifecycle.IdleSince(ev); ev.Active == 0 && !since.IsZero() {
			row.IdleSince = &since
		}
		if ms != nil {
			if mm, ok := ms.models[m.Name()]; ok {
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
	progress(m.Snapshot().Lifecycle.State.String())
	events, cancel := a.hub.subscribe()
	defer cancel()
	done := make(chan error, 1)
	go func() {
		t, err := m.Admit(ctx, lease.Request{Model: m.Name(), Client: "napctl", Kind: request.Other})
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
			if e.Model == m.Name() && e.Kind == control.EventState {
				progress(e.To)
			}
		}
	}
}

// Sleep implements control.Controller. An operator sleep drains live
// leases first; "" means the model's own strategy. The outcome is the
// sleep's own result, not read off the event stream (which may drop).
func (a *Agent) Sleep(ctx context.Context, name, strategy string) error {
	m, err := a.model(name)
	if err != nil {
		return err
	}
	return m.Sleep(ctx, strategy)
}

// Reset implements control.Controller.
func (a *Agent) Reset(name string) error {
	m, err := a.model(name)
	if err != nil {
		return err
	}
	m.Reset()
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
	return a.sup.Logs(m.Snapshot().Spec, lines)
}

// Subscribe implements control.Controller.
func (a *Agent) Subscribe() (<-chan control.Event, func()) { return a.hub.subscribe() }

// controlDecision is a planner decision as an event.
func controlDecision(d planner.Decision) control.Event {
	return control.Event{Time: time.Now(), Model: d.Model, Kind: control.EventDecision, Reason: d.Message}
}
