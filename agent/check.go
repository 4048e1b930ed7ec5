package agent

import (
	"path/filepath"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/remote"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/internal/statefile"
)

// Check finds what would make napd fail to start with cfg although the
// file itself is valid: an api_keys_file that is missing, unreadable or
// malformed, a remote model's api_key_file or tls_ca_file that cannot be
// read (or that every user may read, for the key), and a state_dir, logs/ or control socket directory that
// another user owns or may write. Run checks it first; `napd --check`
// reports it the same way as the config's own problems.
func Check(cfg *config.Config) error {
	var problems config.Errors
	add := func(key string, err error) {
		problems = append(problems, config.Problem{File: cfg.Path, Key: key, Message: err.Error()})
	}
	if cfg.Gateway.APIKeysFile != "" {
		if _, err := gateway.LoadAPIKeys(cfg.Gateway.APIKeysFile, cfg.Policy.Priorities); err != nil {
			add("gateway.api_keys_file", err)
		}
	}
	for _, m := range cfg.Models {
		// A remote model's files, as its link reads them (agent/remote).
		if m.APIKeyFile != "" {
			if _, err := remote.ReadCredential(m.APIKeyFile); err != nil {
				add("models."+m.Name+".api_key_file", err)
			}
		}
		if m.TLSCAFile != "" {
			if _, err := remote.ReadCA(m.TLSCAFile); err != nil {
				add("models."+m.Name+".tls_ca_file", err)
			}
		}
	}
	for _, d := range []struct{ key, dir string }{
		{"agent.state_dir", cfg.Agent.StateDir},
		{"agent.state_dir", filepath.Join(cfg.Agent.StateDir, "logs")},
		{"agent.control_socket", filepath.Dir(cfg.Agent.ControlSocket)},
	} {
		if err := statefile.CheckCreatable(d.dir); err != nil {
			add(d.key, err)
		}
	}
	if len(problems) > 0 {
		return problems
	}
	return nil
}
