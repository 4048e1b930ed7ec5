package agent

import (
	"errors"
	"fmt"
	"net"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agentcheck"
	"github.com/napd/napd/gateway"
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
	s := m.snap.Load()
	return agentcheck.Status{Health: balancerHealth(s.lc.State), State: s.lc.State.String(), QueueDepth: s.queueDepth}, true
}

// balancerHealth is the one place that decides what a balancer is told
// about a model in state st. A wake under way counts as serving: the
// requests that follow the one that woke it queue for it, instead of
// waking the model on another host too.
//
// Waiting for room (a wake queued behind other models' GPU memory, issue
// 13) is to answer Draining, as a drain does: add it here when it exists.
func balancerHealth(st lifecycle.State) agentcheck.Health {
	switch st {
	case lifecycle.Awake, lifecycle.Unsupported, lifecycle.Waking:
		return agentcheck.Serving
	case lifecycle.Sleeping, lifecycle.Unverified:
		return agentcheck.Wakeable
	case lifecycle.Draining:
		return agentcheck.Draining
	}
	return agentcheck.Failed
}

// RefusesBeforeWork marks a ZMQ worker's transport as a
// gateway.RefusingTransport: by the engine contract, its "no room" 503 is
// sent before the worker starts on the request, so the gateway passes it on
// as 503 (which a balancer may retry on another host).
func (*zmqEngine) RefusesBeforeWork() {}

var _ gateway.RefusingTransport = (*zmqEngine)(nil)
