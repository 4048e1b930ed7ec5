package model

import (
	"os"
	"os/user"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/supervisor"
)

// SpecOf builds the supervisor's spec for a model on port.
func SpecOf(mc *config.Model, port int) supervisor.Spec {
	var cmd []string
	var env map[string]string
	if len(mc.Command) > 0 || len(mc.Environment) > 0 {
		cmd, env = mc.ExpandPort(port)
	}
	spec := supervisor.Spec{
		Model:            mc.Name,
		Command:          cmd,
		Unit:             mc.Unit,
		Port:             port,
		Environment:      env,
		GPUs:             mc.GPUs,
		WorkingDirectory: mc.WorkingDirectory,
		Health:           mc.Health,
		Sleep:            mc.Sleep,
		StopTimeout:      mc.StopTimeout,
	}
	if spec.Container = containerOf(mc, port); spec.Container == nil {
		spec.User = engineUser(mc.User)
	}
	return spec
}

// containerOf is the container a model's engine runs in on port; nil for a
// model without an image.
func containerOf(mc *config.Model, port int) *supervisor.Container {
	if mc.Image == "" {
		return nil
	}
	return &supervisor.Container{
		Runtime: mc.ContainerRuntime,
		Program: mc.ContainerProgram,
		Image:   config.ExpandPortIn([]string{mc.Image}, port)[0],
		Volumes: config.ExpandPortIn(mc.Volumes, port),
		Args:    config.ExpandPortIn(mc.ContainerArgs, port),
		Pull:    mc.Pull,
		Port:    mc.ContainerPort,
	}
}

// DefaultEngineUser is the account engines run as when a model sets no
// user and napd runs as root: the package creates it (sysusers.d), so an
// engine does not get root's power by default.
const DefaultEngineUser = "napd-engine"

// engineUser is the user an engine runs as: the model's, else
// DefaultEngineUser when napd is root and that account exists, else napd's
// own (a developer running napd as themselves).
func engineUser(configured string) string {
	if configured != "" || os.Geteuid() != 0 {
		return configured
	}
	if _, err := user.Lookup(DefaultEngineUser); err == nil {
		return DefaultEngineUser
	}
	return ""
}
