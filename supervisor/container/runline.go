package container

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/napd/napd/gpuvendor"
	"github.com/napd/napd/supervisor"
)

// Runtimes napd drives. Their command lines agree on everything napd uses
// (create, start, stop, rm, wait, logs, container inspect, ps) except how
// GPUs are passed and podman's --cgroups.
const (
	Podman = "podman"
	Docker = "docker"
)

// Labels napd puts on each container it creates. LabelModel and
// LabelInstance find napd's containers again (a napd only ever touches its
// own instance's); LabelSpec records the spec it was created from, so that
// a container of an older config is never adopted.
const (
	LabelModel    = "napd.model"
	LabelInstance = "napd.instance"
	LabelSpec     = "napd.spec"
)

// Name is the container of model's engine: the name of its systemd unit,
// without the suffix.
func Name(model string) string { return supervisor.UnitPrefix + model }

// createArgs is the create line of spec's container, after the program:
// napd's name and labels, the pull policy, the network, the GPUs, the
// environment (by name: the values reach the runtime through its own
// environment, never its argv, where every local user could read them),
// the volumes, the operator's container_args, the image and the command.
// split asks podman to run conmon and the container in sub-groups of the
// caller's cgroup, which for `podman start` under systemd is the engine's
// unit.
func createArgs(spec supervisor.Spec, instance string, split bool) []string {
	c := spec.Container
	args := []string{"create", "--name", Name(spec.Model),
		"--label", LabelModel + "=" + spec.Model,
		"--label", LabelInstance + "=" + instance,
		"--label", LabelSpec + "=" + specHash(spec),
		"--pull", pullPolicy(c.Pull),
	}
	if c.Port > 0 {
		args = append(args, "--publish", "127.0.0.1:"+strconv.Itoa(spec.Port)+":"+strconv.Itoa(c.Port))
	} else {
		args = append(args, "--network", "host")
	}
	if split && c.Runtime == Podman {
		args = append(args, "--cgroups=split")
	}
	args = append(args, gpuArgs(c.Runtime, spec.GPUDevices())...)
	for _, k := range slices.Sorted(maps.Keys(spec.Environment)) {
		args = append(args, "--env", k)
	}
	for _, v := range c.Volumes {
		args = append(args, "--volume", v)
	}
	args = append(args, c.Args...)
	args = append(args, c.Image)
	return append(args, spec.Command...)
}

func pullPolicy(p string) string {
	if p == "" {
		return "never"
	}
	return p
}

// gpuArgs passes the GPUs of the model's placement: docker's --gpus (the
// NVIDIA Container Toolkit), podman's CDI devices (nvidia-ctk cdi
// generate); for ROCm /dev/kfd and each card's render node, for Intel each
// render node. The container sees only those, so no visibility variable
// goes in. docker splits the --gpus value at commas as CSV, so a list of
// several devices is quoted once more, as its documentation shows (--gpus
// '"device=0,1"').
func gpuArgs(runtime string, gpus []supervisor.GPU) []string {
	var args, nvidia []string
	kfd := false
	for _, g := range gpus {
		switch g.Vendor {
		case gpuvendor.NVIDIA:
			if runtime == Docker {
				nvidia = append(nvidia, g.ID)
			} else {
				args = append(args, "--device", "nvidia.com/gpu="+g.Node)
			}
		case gpuvendor.AMD:
			if !kfd {
				args, kfd = append(args, "--device", "/dev/kfd"), true
			}
			args = append(args, "--device", g.Node)
		default:
			args = append(args, "--device", g.Node)
		}
	}
	if len(nvidia) > 0 {
		v := "device=" + strings.Join(nvidia, ",")
		if len(nvidia) > 1 {
			v = `"` + v + `"`
		}
		args = append([]string{"--gpus", v}, args...)
	}
	return args
}

// specHash identifies what the container was created from: everything of
// the spec that shapes it but the GPUs, which napd chooses at each wake for
// gpus = "any" (the model's spec, held against a running container at
// adoption, has none then).
func specHash(spec supervisor.Spec) string {
	c := spec.Container
	env := make([]string, 0, len(spec.Environment))
	for _, k := range slices.Sorted(maps.Keys(spec.Environment)) {
		env = append(env, k+"="+spec.Environment[k])
	}
	b, _ := json.Marshal([]any{c.Runtime, c.Image, spec.Command, env, c.Volumes, c.Args, c.Port, spec.Port})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// stopSeconds is the grace of `stop -t`: the spec's stop timeout in whole
// seconds, rounded up.
func stopSeconds(spec supervisor.Spec) string {
	d := spec.StopTimeout
	if d <= 0 {
		d = DefaultStopTimeout
	}
	secs := (d + 999_999_999) / 1_000_000_000
	return strconv.FormatInt(int64(secs), 10)
}

// runtimeEnv is the part of napd's own environment that configures the
// runtime's client (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, DOCKER_HOST,
// DOCKER_CONFIG, …). A client napd runs itself inherits all of its
// environment; one systemd runs in the engine's unit gets these.
func runtimeEnv(environ []string) map[string]string {
	env := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok && (strings.HasPrefix(k, "CONTAINERS_") || strings.HasPrefix(k, "DOCKER_")) {
			env[k] = v
		}
	}
	return env
}
