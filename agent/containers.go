package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/container"
)

// withContainers wraps the supervisor backend so that models with an image
// run as containers (supervisor/container). It sweeps napd's containers
// before anything starts: the running engines are kept for adoption, the
// rest removed.
func (a *Agent) withContainers(ctx context.Context, b supervisor.Backend, cfg *config.Config) (supervisor.Backend, error) {
	cb, err := container.New(ctx, b, container.Options{StateDir: cfg.Agent.StateDir, Logger: a.log, Runtimes: containerRuntimes(cfg)})
	if err != nil {
		b.Close()
		return nil, err
	}
	return cb, nil
}

// containerRuntimes are the runtimes the config's models use, with their
// executables.
func containerRuntimes(cfg *config.Config) map[string]string {
	out := map[string]string{}
	for _, m := range cfg.Models {
		if m.Image != "" {
			out[m.ContainerRuntime] = m.ContainerProgram
		}
	}
	return out
}

// containerOf is the container a model's engine runs in; nil for a model
// without an image.
func containerOf(mc *config.Model) *supervisor.Container {
	if mc.Image == "" {
		return nil
	}
	return &supervisor.Container{
		Runtime: mc.ContainerRuntime,
		Program: mc.ContainerProgram,
		Image:   mc.Image,
		Volumes: mc.Volumes,
		Args:    mc.ContainerArgs,
		Pull:    mc.Pull,
		Port:    mc.ContainerPort,
	}
}

// CheckNotes says what `napd --check` found beyond the file: the container
// runtime each model with an image uses.
func CheckNotes(cfg *config.Config) []string {
	users := map[string][]string{}
	for _, m := range cfg.Models {
		if m.Image != "" {
			key := m.ContainerRuntime + " (" + m.ContainerProgram + ")"
			users[key] = append(users[key], m.Name)
		}
	}
	var notes []string
	for _, rt := range slices.Sorted(maps.Keys(users)) {
		notes = append(notes, fmt.Sprintf("container runtime %s for %s", rt, strings.Join(users[rt], ", ")))
	}
	return notes
}
