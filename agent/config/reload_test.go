package config

import (
	"slices"
	"testing"
)

// The agent check's listener is bound at start: a reload that changes it
// says so.
func TestRestartOnly_AgentCheckListen(t *testing.T) {
	old, cfg := Default(), Default()
	cfg.Agent.HAProxyAgentListen = "10.0.0.1:8081"
	if got := RestartOnly(old, cfg); !slices.Contains(got, "agent.haproxy_agent_listen") {
		t.Errorf("RestartOnly = %v, want agent.haproxy_agent_listen", got)
	}
}
