package agent

import (
	"errors"
	"fmt"
	"net"

	"github.com/napd/napd/agent/lifecycle"
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
	s := m.Snapshot()
	health := balancerHealth(s.Lifecycle)
	state := s.Lifecycle.State.String()
	if s.Lifecycle.RoomWait {
		state = "waiting for room"
	}
	return agentcheck.Status{Health: health, State: state, QueueDepth: s.QueueDepth}, true
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
