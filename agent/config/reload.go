package config

import "slices"

// RestartOnly lists the keys whose change from old to cfg a reload cannot
// apply: listeners, the state directory and the supervisor are bound at
// start.
func RestartOnly(old, cfg *Config) []string {
	var keys []string
	for _, c := range []struct {
		key     string
		changed bool
	}{
		{"agent.supervisor", old.Agent.Supervisor != cfg.Agent.Supervisor},
		{"agent.state_dir", old.Agent.StateDir != cfg.Agent.StateDir},
		{"agent.control_socket", old.Agent.ControlSocket != cfg.Agent.ControlSocket},
		{"agent.metrics_listen", old.Agent.MetricsListen != cfg.Agent.MetricsListen},
		{"agent.events_address", old.Agent.EventsAddress != cfg.Agent.EventsAddress},
		{"agent.haproxy_agent_listen", old.Agent.HAProxyAgentListen != cfg.Agent.HAProxyAgentListen},
		{"gateway.listen", !slices.Equal(old.Gateway.Listen, cfg.Gateway.Listen)},
		{"gateway.keepalive_timeout", old.Gateway.KeepaliveTimeout != cfg.Gateway.KeepaliveTimeout},
		{"gateway.max_connections", old.Gateway.MaxConnections != cfg.Gateway.MaxConnections},
	} {
		if c.changed {
			keys = append(keys, c.key)
		}
	}
	oldListen := make(map[string]string)
	for _, m := range old.Models {
		oldListen[m.Name] = m.Listen
	}
	for _, m := range cfg.Models {
		if m.Listen != "" && oldListen[m.Name] != m.Listen {
			keys = append(keys, "models."+m.Name+".listen")
		}
	}
	return keys
}
