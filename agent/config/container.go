package config

import (
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
)

// Container runtimes for agent.container_runtime and
// models.NAME.container_runtime.
const (
	RuntimeAuto   = "auto" // podman when it is on PATH, else docker
	RuntimePodman = "podman"
	RuntimeDocker = "docker"
)

// Pull policies for models.NAME.pull.
const (
	PullNever   = "never"   // napd never reaches a registry
	PullMissing = "missing" // the runtime pulls an image it does not have
)

// containerKeys are the model keys that shape a container engine; all but
// image are only used with image.
var containerKeys = []string{"image", "container_runtime", "volumes", "container_args", "pull", "container_port"}

// containerSchema decodes a model's container keys.
func containerSchema(m *Model) map[string]setter {
	return map[string]setter{
		"image":             setString(&m.Image, imageRef),
		"container_runtime": setEnum(&m.ContainerRuntime, RuntimePodman, RuntimeDocker),
		"volumes":           setStrings(&m.Volumes, volumeSpec),
		"container_args":    setStrings(&m.ContainerArgs, nil),
		"pull":              setEnum(&m.Pull, PullNever, PullMissing),
		"container_port":    setInt(&m.ContainerPort, 1, 65535),
	}
}

// imageRef checks an image reference: what follows the flags of a run
// line, so never a flag itself, and one word.
func imageRef(s string) error {
	switch {
	case s == "":
		return errors.New("must not be empty")
	case strings.HasPrefix(s, "-"):
		return fmt.Errorf("image %q starts with '-': the runtime would read it as a flag", s)
	case strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return fmt.Errorf("image %q contains whitespace or a control character", s)
	}
	return nil
}

// volumeSpec checks SOURCE:DEST[:OPTIONS]: a host path or named volume,
// and an absolute path in the container.
func volumeSpec(s string) error {
	if hasControl(s) || strings.HasPrefix(s, "-") {
		return fmt.Errorf("volume %q starts with '-' or contains a control character", s)
	}
	parts := strings.Split(s, ":")
	switch {
	case len(parts) < 2 || parts[1] == "":
		return fmt.Errorf("volume %q has no container path (want SOURCE:DEST[:OPTIONS], e.g. \"/srv/hf:/root/.cache/huggingface:ro\")", s)
	case len(parts) > 3:
		return fmt.Errorf("volume %q has more than SOURCE:DEST:OPTIONS", s)
	case parts[0] == "":
		return fmt.Errorf("volume %q has no source", s)
	case !strings.HasPrefix(parts[1], "/"):
		return fmt.Errorf("volume %q: the container path %q is not absolute", s, parts[1])
	}
	return nil
}

// reservedFlags are the create flags napd sets itself, with what to use
// instead.
var reservedFlags = map[string]string{
	"--name":          "napd names the container napd-engine-<model>",
	"--network":       "napd uses the host's network, or publishes container_port",
	"--net":           "napd uses the host's network, or publishes container_port",
	"--rm":            "napd removes the container itself, after its stop",
	"--detach":        "napd starts the container itself",
	"-d":              "napd starts the container itself",
	"--replace":       "napd removes the model's old container itself",
	"--pull":          "use pull",
	"--publish":       "use container_port",
	"-p":              "use container_port",
	"--publish-all":   "use container_port",
	"-P":              "use container_port",
	"--gpus":          "GPUs follow the model's gpus",
	"--cgroups":       "napd sets podman's cgroups under systemd",
	"--cgroup-parent": "napd's supervisor places the container",
}

// checkContainerArgs refuses flags that would undo napd's own, and labels
// in napd's namespace.
func checkContainerArgs(args []string) error {
	for i, a := range args {
		if hasControl(a) {
			return fmt.Errorf("element %d contains a control character", i)
		}
		flag, value, hasValue := strings.Cut(a, "=")
		if why, ok := reservedFlags[flag]; ok {
			return fmt.Errorf("%q is napd's own: %s", a, why)
		}
		if flag == "--label" || flag == "-l" {
			if !hasValue && i+1 < len(args) {
				value = args[i+1]
			}
			if strings.HasPrefix(value, "napd.") {
				return fmt.Errorf("label %q is in napd's namespace (napd.*)", value)
			}
		}
	}
	return nil
}

// checkContainer checks a container model's keys against each other and
// finds its runtime's executable.
func (d *decoder) checkContainer(m *Model, t *table, agent Agent) {
	if m.Image == "" {
		for _, k := range containerKeys[1:] {
			if t.has(k) {
				d.addAt(t.at(k), "only used with image")
			}
		}
		return
	}
	for _, k := range []string{"unit", "user", "working_directory"} {
		if t.has(k) {
			msg := map[string]string{
				"unit":              "image and unit are both set: napd runs the container in a unit of its own",
				"user":              "a container runs as its image's user: set --user in container_args",
				"working_directory": "a container starts in its image's directory: set --workdir in container_args",
			}[k]
			d.addAt(t.at(k), msg)
		}
	}
	if m.ContainerPort != 0 && m.Transport != TransportHTTP {
		d.addAt(t.at("container_port"), `only used with transport = "http"`)
	}
	if err := checkContainerArgs(m.ContainerArgs); err != nil {
		d.addAt(t.at("container_args"), err.Error())
	}
	if m.Pull == "" {
		m.Pull = PullNever
	}
	runtimeKey, choice := "image", agent.ContainerRuntime
	if m.ContainerRuntime != "" {
		runtimeKey, choice = "container_runtime", m.ContainerRuntime
	}
	name, path, err := findRuntime(choice)
	if err != nil {
		d.addAt(t.at(runtimeKey), err.Error())
		return
	}
	m.ContainerRuntime, m.ContainerProgram = name, path
}

// findRuntime resolves a container_runtime choice to a runtime and its
// executable on PATH.
func findRuntime(choice string) (name, path string, err error) {
	if choice != RuntimeAuto {
		p, err := exec.LookPath(choice)
		if err != nil {
			return "", "", fmt.Errorf("container runtime %s is not on PATH", choice)
		}
		return choice, p, nil
	}
	for _, rt := range []string{RuntimePodman, RuntimeDocker} {
		if p, err := exec.LookPath(rt); err == nil {
			return rt, p, nil
		}
	}
	return "", "", errors.New(`a container needs podman or docker (agent.container_runtime = "auto"), and neither is on PATH`)
}

// ContainerRuntimes are the runtimes the models with an image use, with
// their executables.
func (c *Config) ContainerRuntimes() map[string]string {
	out := map[string]string{}
	for _, m := range c.Models {
		if m.Image != "" {
			out[m.ContainerRuntime] = m.ContainerProgram
		}
	}
	return out
}

// CheckNotes says what `napd --check` found beyond the file: the container
// runtime each model with an image uses.
func (c *Config) CheckNotes() []string {
	users := map[string][]string{}
	for _, m := range c.Models {
		if m.Image != "" {
			key := m.ContainerRuntime + " (" + m.ContainerProgram + ")"
			users[key] = append(users[key], m.Name)
		}
	}
	var notes []string
	for _, rt := range slices.Sorted(maps.Keys(users)) {
		notes = append(notes, fmt.Sprintf("container runtime %s for %s", rt, strings.Join(users[rt], ", ")))
	}
	return append(notes, c.selfSleepNotes()...)
}
