package agent

import (
	"context"
	"errors"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/remote"
	"github.com/napd/napd/gateway"
)

// The models served elsewhere (docs/remote.md) in the registry: they have
// no loop and no engine; requests reach them through agent/remote, and
// the local models' overflow through overflow.

// applyRemote puts the remote model of link in r: the one of old, given
// the new link, or a new one.
func (a *Agent) applyRemote(r *registry, link *remote.Link, old *registry) {
	name := link.Name()
	var m *remote.Model
	if old != nil {
		m = old.remoteName[name]
	}
	if m != nil {
		m.Reconfigure(link)
	} else {
		m = remote.New(remote.Deps{Tracker: a.tracker, Clock: a.clock, Emit: a.hub.Publish,
			StatusChanged: a.notify.Kick, Log: a.log, Ctx: a.ctx}, link)
	}
	r.remotes = append(r.remotes, m)
	r.remoteName[name] = m
}

// retireRemotes closes the remote models of old that reg no longer has
// (their requests under way finish) and drops their series.
func (a *Agent) retireRemotes(old, reg *registry) {
	for _, m := range old.remotes {
		if reg.remoteName[m.Name()] != m {
			m.Close()
			a.metrics.Forget(m.Name())
		}
	}
}

// overflow is the local models' Deps.Overflow: the first of targets that
// takes the request.
func (a *Agent) overflow(ctx context.Context, targets []string, id lease.ID) (*gateway.Ticket, lease.Moved, error) {
	reg := a.reg.Load()
	for _, name := range targets {
		m := reg.remoteName[name]
		if m == nil {
			continue // removed by a reload meanwhile
		}
		t, moved, err := m.Adopt(ctx, id)
		if errors.Is(err, remote.ErrUnavailable) {
			continue
		}
		return t, moved, err
	}
	return nil, lease.Moved{}, model.ErrNoOverflow
}

// remoteInfo is a remote model's /v1/models entry.
func remoteInfo(s remote.Snapshot) gateway.ModelInfo {
	return gateway.ModelInfo{Name: s.Config.Name, Aliases: s.Config.Aliases, Unlisted: !s.Config.Listed, State: s.State.String(),
		Reason: s.Reason, Serving: s.State.Serving()}
}

// remoteRow is a remote model's row in napctl status.
func (a *Agent) remoteRow(m *remote.Model) control.ModelStatus {
	s := m.Snapshot()
	ev, _ := a.tracker.Evidence(m.Name())
	return control.ModelStatus{Name: m.Name(), Aliases: s.Config.Aliases, State: s.State.String(), Reason: s.Reason,
		StateSince: s.Since, Transport: "http", Sleep: "none", Leases: ev.Active, QueueDepth: s.QueueDepth,
		Remote: s.Config.URL, RemoteState: s.RemoteState}
}

// remoteMetrics is a remote model's gauges.
func (a *Agent) remoteMetrics(m *remote.Model) metrics.Model {
	s := m.Snapshot()
	ev, _ := a.tracker.Evidence(m.Name())
	return metrics.Model{Name: m.Name(), State: s.State, QueueDepth: s.QueueDepth, Leases: ev.Active, EngineBytes: -1}
}

// notLocal is the control API's answer about a remote model: napd has no
// engine of it to wake, sleep, reset or read the logs of.
func notLocal(name string) error {
	return errors.New("model " + name + " is a remote model (url): napd has no engine of it to wake, sleep, reset or read the logs of")
}
