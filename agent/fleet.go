package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agentcheck"
)

// startAgentCheck serves HAProxy's agent check on addr (agent
// haproxy_agent_listen): each model's published state, as a balancer in
// front of several napd hosts should weigh it (docs/fleet.md).
func (a *Agent) startAgentCheck(addr string) (*agentcheck.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("haproxy_agent_listen %s: %w", addr, err)
	}
	srv := agentcheck.New(a.agentCheckStatus, agentcheck.Options{Logger: a.log.With("listener", "haproxy agent")})
	go func() {
		if err := srv.Serve(l); !errors.Is(err, net.ErrClosed) {
			a.log.Error("server stopped", "listener", "haproxy agent", "err", err)
		}
	}()
	return srv, nil
}

// agentCheckStatus is the agent check's lookup: the model's published
// snapshot, never its loop, so a check cannot wait on a busy model.
func (a *Agent) agentCheckStatus(name string) (agentcheck.Status, bool) {
	m, ok := a.reg.Load().resolve(name)
	if !ok {
		return agentcheck.Status{}, false
	}
	return balancerStatus(m.Snapshot(), a.stopping.Load()), true
}

// balancerStatus is what a balancer is told of a model in snapshot s; a
// stopping napd drains every model.
func balancerStatus(s model.Snapshot, stopping bool) agentcheck.Status {
	health := balancerHealth(s.Lifecycle)
	state := s.Lifecycle.State.String()
	if s.Lifecycle.RoomWait {
		state = "waiting for room"
	}
	if stopping {
		health, state = agentcheck.Draining, "napd stopping"
	}
	return agentcheck.Status{Health: health, State: state, QueueDepth: s.QueueDepth}
}

// Bounds of tellBalancers: HAProxy asks every agent-inter (2 s by
// default, 1 s in docs/examples/haproxy.cfg).
const (
	askedLately      = 5 * time.Second // a balancer that asked within it is waited for
	tellBalancersFor = 5 * time.Second // at most, and within the shutdown grace
)

// tellBalancers turns every agent check answer to drain and waits until
// each balancer that asked lately has asked again, before the gateway
// stops listening: HAProxy then sends this host no new request. A
// connection refused by a stopped host is retried at once, on the same
// host as long as HAProxy still counts it up (its health check takes a
// second or two to see it down), so without this the requests of that
// moment failed.
func (a *Agent) tellBalancers(s *servers, grace time.Duration) {
	if s.agentCheck == nil {
		return
	}
	a.stopping.Store(true)
	since := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), min(grace, tellBalancersFor))
	defer cancel()
	if err := s.agentCheck.AskedAgain(ctx, since, askedLately); err != nil {
		a.log.Warn("stopping before every balancer asked again and was told to drain", "waited", time.Since(since).Round(time.Millisecond))
		return
	}
	a.log.Info("balancers told to drain", "waited", time.Since(since).Round(time.Millisecond))
}

// balancerHealth is the one place that decides what a balancer is told
// about a model. A wake under way counts as serving: the requests that
// follow the one that woke it queue for it, instead of waking the model on
// another host too. A wake that waits for GPU memory other models hold
// drains, as a drain does: the next requests go to another host.
func balancerHealth(lc lifecycle.Snapshot) agentcheck.Health {
	switch lc.State {
	case lifecycle.Waking:
		if lc.RoomWait {
			return agentcheck.Draining
		}
		return agentcheck.Serving
	case lifecycle.Awake, lifecycle.Unsupported:
		return agentcheck.Serving
	case lifecycle.Sleeping, lifecycle.Unverified:
		return agentcheck.Wakeable
	case lifecycle.Draining:
		return agentcheck.Draining
	}
	return agentcheck.Failed
}
