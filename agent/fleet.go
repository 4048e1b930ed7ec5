package agent

import (
	"time"

	"github.com/napd/napd/agent/fleet"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/servers"
	"github.com/napd/napd/agentcheck"
)

// startAgentCheck serves HAProxy's agent check on addr (agent
// haproxy_agent_listen): each model's published state, as a balancer in
// front of several napd hosts should weigh it (docs/fleet.md).
func (a *Agent) startAgentCheck(addr string) (*agentcheck.Server, error) {
	return fleet.Serve(addr, func(name string) (model.Snapshot, bool) {
		m, ok := a.reg.Load().resolve(name)
		if !ok {
			return model.Snapshot{}, false
		}
		return m.Snapshot(), true
	}, a.stopping.Load, a.log)
}

// tellBalancers turns every agent check answer to drain and waits, within
// grace, until each balancer that asked lately has heard it.
func (a *Agent) tellBalancers(s *servers.Servers, grace time.Duration) {
	if s.AgentCheck == nil {
		return
	}
	a.stopping.Store(true)
	fleet.Drain(s.AgentCheck, grace, a.log)
}
