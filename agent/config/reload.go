package config

import "slices"

// RestartOnly lists the keys whose change from old to cfg a reload cannot
// apply: listeners, the state directory and the supervisor are bound at
// start.
func RestartOnly(old, cfg *Config) []string {
	var keys []string
	if old.Agent.Supervisor != cfg.Agent.Supervisor {
		keys = append(keys, "agent.supervisor")
	}
	if old.Agent.StateDir != cfg.Agent.StateDir {
		keys = append(keys, "agent.state_dir")
	}
	if old.Agent.ControlSocket != cfg.Agent.ControlSocket {
		keys = append(keys, "agent.control_socket")
	}
	if old.Agent.MetricsListen != cfg.Agent.MetricsListen {
		keys = append(keys, "agent.metrics_listen")
	}
	if old.Agent.EventsAddress != cfg.Agent.EventsAddress {
		keys = append(keys, "agent.events_address")
	}
	if old.Agent.HAProxyAgentListen != cfg.Agent.HAProxyAgentListen {
		keys = append(keys, "agent.haproxy_agent_listen")
	}
	if !slices.Equal(old.Gateway.Listen, cfg.Gateway.Listen) {
		keys = append(keys, "gateway.listen")
	}
	if old.Gateway.KeepaliveTimeout != cfg.Gateway.KeepaliveTimeout {
		keys = append(keys, "gateway.keepalive_timeout")
	}
	if old.Gateway.MaxConnections != cfg.Gateway.MaxConnections {
		keys = append(keys, "gateway.max_connections")
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
