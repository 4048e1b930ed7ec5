package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/gateway"
)

// The Agent is the control API's Controller.
var _ control.Controller = (*Agent)(nil)

func (a *Agent) model(name string) (*model.Model, error) {
	reg := a.reg.Load()
	m, ok := reg.resolve(name)
	if !ok {
		if n, remote := reg.resolveName(name); remote {
			return nil, notLocal(n)
		}
		return nil, fmt.Errorf("%w: %q", control.ErrNotFound, name)
	}
	return m, nil
}

// Status implements control.Controller.
func (a *Agent) Status() control.Status {
	cfg := a.cfg.Load()
	st := control.Status{Version: a.opts.Version, Supervisor: a.sup.Name(), Config: cfg.Path, Started: a.started}
	ms := a.desk.Measured()
	if ms != nil {
		if ms.HaveMem {
			st.Host = control.HostMemory{TotalBytes: ms.Host.MemTotal, AvailableBytes: ms.Host.MemAvailable}
			if ms.Host.HavePSI {
				v := ms.Host.PSI.Some.Avg10
				st.Host.PSISomeAvg10 = &v
			}
		}
		for _, d := range ms.GPUs.Devices {
			st.GPUs = append(st.GPUs, control.GPUMemory{Index: d.Index, Vendor: d.Vendor, UUID: d.UUID, PCI: d.PCI, Name: d.Name,
				TotalBytes: d.Total, UsedBytes: d.Used, FreeBytes: d.Free})
		}
	}
	for _, m := range a.reg.Load().list {
		s := m.Snapshot()
		ev, _ := a.tracker.Evidence(m.Name())
		row := control.ModelStatus{
			Name: m.Name(), Aliases: s.Config.Aliases, State: s.Lifecycle.State.String(), Reason: ms.Reason(m.Name(), s.Lifecycle),
			StateSince: s.Lifecycle.Since, Port: s.Spec.Port, Transport: string(s.Config.Transport), Sleep: s.Config.Sleep, Pinned: s.Config.Pinned,
			Leases: ev.Active, QueueDepth: s.QueueDepth, LastWakeMs: s.Lifecycle.LastWake.Milliseconds(),
			Attempts: s.Lifecycle.Attempts,
			Unit:     a.sup.UnitName(s.Spec), GPUs: a.desk.GPUs(s), Placement: a.desk.PlacedWhy(m.Name()),
			SleptWith: s.Slept,
		}
		if s.Load != nil {
			row.Load = s.Load.Wire()
		}
		fp := a.desk.Footprint(s)
		row.Footprint, row.FootprintSource, row.FootprintFrom = fp.Bytes, fp.Source, fp.From
		if r, ok := a.weights.Residency(m.Name()); ok {
			row.Weights, row.WeightsResident = r.Bytes, &r.Resident
		}
		if holders := a.desk.WaitingFor(m.Name()); holders != "" {
			row.RoomWaiting, row.WaitingFor = s.QueueDepth, holders
		}
		if since := ms.IdleSince(m.Name(), s.Lifecycle, ev); ev.Active == 0 && !since.IsZero() {
			row.IdleSince = &since
		}
		if ms != nil {
			if mm, ok := ms.Models[m.Name()]; ok {
				if mm.Proc.HaveMemory {
					b := mm.Proc.MemoryBytes
					row.EngineBytes = &b
				}
				row.GPUBytes = gpuBytesByIndex(mm.GPUBytes)
			}
		}
		st.Models = append(st.Models, row)
	}
	for _, m := range a.reg.Load().remotes {
		st.Models = append(st.Models, a.remoteRow(m))
	}
	st.Usage, st.Quotas = usageRows(a.usage.Since(a.clock().Add(-24*time.Hour))), a.quotasToday(a.clock())
	return st
}

// Wake implements control.Controller: an operator wake is an arrival with
// no request behind it, holding a lease while it waits so the planner
// leaves the model alone.
func (a *Agent) Wake(ctx context.Context, name string, progress func(control.Progress)) error {
	m, err := a.model(name)
	if err != nil {
		return err
	}
	phase := m.Snapshot().Lifecycle.State.String()
	progress(control.Progress{Phase: phase})
	events, cancel := a.hub.Subscribe()
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.AdmitOnce(ctx, "napctl") }()
	for {
		select {
		case err := <-done:
			var r *gateway.Refusal
			if errors.As(err, &r) {
				return errors.New(r.Message)
			}
			return err
		case e := <-events:
			switch {
			case e.Model != m.Name():
			case e.Kind == control.EventState:
				phase = e.To
				progress(control.Progress{Phase: phase})
			case e.Kind == control.EventLoad:
				progress(control.Progress{Phase: phase, Load: e.Load})
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
func (a *Agent) Subscribe() (<-chan control.Event, func()) { return a.hub.Subscribe() }

// metricsSnapshot feeds the scrape-time gauges.
func (a *Agent) metricsSnapshot() metrics.Snapshot {
	ms := a.desk.Measured()
	snap := metrics.Snapshot{HostAvailable: -1, Usage: a.usageMetrics()}
	for _, m := range a.reg.Load().list {
		s := m.Snapshot()
		ev, _ := a.tracker.Evidence(m.Name())
		mm := metrics.Model{Name: m.Name(), State: s.Lifecycle.State, QueueDepth: s.QueueDepth, Leases: ev.Active, EngineBytes: -1}
		if r, ok := a.weights.Residency(m.Name()); ok {
			mm.WeightsBytes, mm.WeightsResident = r.Bytes, r.Resident
		}
		if ms != nil {
			if me, ok := ms.Models[m.Name()]; ok {
				if me.Proc.HaveMemory {
					mm.EngineBytes = me.Proc.MemoryBytes
				}
				mm.GPUBytes = gpuBytesByIndex(me.GPUBytes)
			}
		}
		snap.Models = append(snap.Models, mm)
	}
	for _, m := range a.reg.Load().remotes {
		snap.Models = append(snap.Models, a.remoteMetrics(m))
	}
	if ms != nil {
		if ms.HaveMem {
			snap.HostAvailable = ms.Host.MemAvailable
			snap.HavePSI, snap.PSISomeAvg10 = ms.Host.HavePSI, ms.Host.PSI.Some.Avg10
		}
		for _, d := range ms.GPUs.Devices {
			if d.HaveMemory {
				snap.GPUs = append(snap.GPUs, metrics.GPU{Index: strconv.Itoa(d.Index), Vendor: d.Vendor, Total: d.Total, Used: d.Used})
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
