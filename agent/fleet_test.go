package agent

import (
	"slices"
	"testing"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agentcheck"
)

// TestBalancerHealth_EveryState: each lifecycle state has a deliberate
// answer; a state added later fails here until it is given one.
func TestBalancerHealth_EveryState(t *testing.T) {
	want := map[lifecycle.State]agentcheck.Health{
		lifecycle.Awake:       agentcheck.Serving,
		lifecycle.Unsupported: agentcheck.Serving,
		lifecycle.Waking:      agentcheck.Serving,
		lifecycle.Sleeping:    agentcheck.Wakeable,
		lifecycle.Unverified:  agentcheck.Wakeable,
		lifecycle.Draining:    agentcheck.Draining,
		lifecycle.Failed:      agentcheck.Failed,
	}
	for _, s := range lifecycle.States() {
		h, ok := want[s]
		if !ok {
			t.Errorf("state %s: no answer decided for balancers (balancerHealth)", s)
			continue
		}
		if got := balancerHealth(lifecycle.Snapshot{State: s}); got != h {
			t.Errorf("balancerHealth(%s) = %d, want %d", s, got, h)
		}
	}
	if got := balancerHealth(lifecycle.Snapshot{State: lifecycle.Waking, RoomWait: true}); got != agentcheck.Draining {
		t.Errorf("balancerHealth(waking for room) = %d, want Draining", got)
	}
}

// A stopping napd tells balancers to drain every model, whatever its
// state, and keeps reporting its queue.
func TestBalancerStatus_Stopping(t *testing.T) {
	awake := model.Snapshot{Lifecycle: lifecycle.Snapshot{State: lifecycle.Awake}, QueueDepth: 3}
	if got := balancerStatus(awake, false); got != (agentcheck.Status{Health: agentcheck.Serving, State: "awake", QueueDepth: 3}) {
		t.Errorf("awake: %+v", got)
	}
	for _, s := range lifecycle.States() {
		snap := awake
		snap.Lifecycle.State = s
		if got := balancerStatus(snap, true); got != (agentcheck.Status{Health: agentcheck.Draining, State: "napd stopping", QueueDepth: 3}) {
			t.Errorf("%s while stopping: %+v", s, got)
		}
	}
	room := model.Snapshot{Lifecycle: lifecycle.Snapshot{State: lifecycle.Waking, RoomWait: true}}
	if got := balancerStatus(room, false); got.Health != agentcheck.Draining || got.State != "waiting for room" {
		t.Errorf("waking for room: %+v", got)
	}
}

// The agent check's listener is bound at start: a reload that changes it
// says so.
func TestRestartOnlyChanges_AgentCheckListen(t *testing.T) {
	old, cfg := config.Default(), config.Default()
	cfg.Agent.HAProxyAgentListen = "10.0.0.1:8081"
	if got := restartOnlyChanges(old, cfg); !slices.Contains(got, "agent.haproxy_agent_listen") {
		t.Errorf("restartOnlyChanges = %v, want agent.haproxy_agent_listen", got)
	}
}
