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

// Every restart-only key is named when it changes, each once; a model's
// own listen only when set and changed; nothing when nothing changed.
func TestRestartOnly_EachKey(t *testing.T) {
	old := Default()
	old.Models = []*Model{{Name: "a", Listen: "127.0.0.1:9001"}, {Name: "b"}}
	if got := RestartOnly(old, old); got != nil {
		t.Errorf("no change: %v", got)
	}
	cfg := Default()
	cfg.Agent.Supervisor, cfg.Agent.StateDir, cfg.Agent.ControlSocket = "exec", "/x", "/x/c.sock"
	cfg.Agent.MetricsListen, cfg.Agent.EventsAddress, cfg.Agent.HAProxyAgentListen = "", "ipc:///x", "127.0.0.1:1"
	cfg.Gateway.Listen, cfg.Gateway.KeepaliveTimeout, cfg.Gateway.MaxConnections = nil, 0, 1
	cfg.Models = []*Model{{Name: "a", Listen: "127.0.0.1:9002"}, {Name: "b"}, {Name: "c", Listen: "127.0.0.1:9003"}}
	want := []string{"agent.supervisor", "agent.state_dir", "agent.control_socket", "agent.metrics_listen",
		"agent.events_address", "agent.haproxy_agent_listen", "gateway.listen", "gateway.keepalive_timeout",
		"gateway.max_connections", "models.a.listen", "models.c.listen"}
	if got := RestartOnly(old, cfg); !slices.Equal(got, want) {
		t.Errorf("RestartOnly = %v\nwant %v", got, want)
	}
}
