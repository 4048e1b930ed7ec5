package container

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/gpuvendor"
	"github.com/napd/napd/supervisor"
)

func vllmSpec() supervisor.Spec {
	return supervisor.Spec{
		Model:       "qwen",
		Command:     []string{"--model", "Qwen/Qwen3-8B", "--port", "8101", "--served-model-name", "Qwen 3 (8B)"},
		Port:        8101,
		Environment: map[string]string{"VLLM_SERVER_DEV_MODE": "1", "HF_TOKEN": "hf_secret"},
		GPUs:        []int{0, 1},
		StopTimeout: 30 * time.Second,
		Container: &supervisor.Container{
			Runtime: Docker, Program: "/usr/bin/docker", Image: "vllm/vllm-openai:v0.11.0",
			Volumes: []string{"/srv/hf:/root/.cache/huggingface:ro"},
			Args:    []string{"--ipc=host", "--shm-size", "16g"},
			Pull:    "never",
		},
	}
}

// The create line, element by element: napd's name and labels, the pull
// policy, the host network, docker's quoted device list, the environment
// by name only, the volume, the operator's flags, the image, then the
// command unchanged (an argument with spaces stays one argument).
func TestCreateArgs_Docker(t *testing.T) {
	spec := vllmSpec()
	got := createArgs(spec, "inst1", true)
	want := []string{"create", "--name", "napd-engine-qwen",
		"--label", "napd.model=qwen", "--label", "napd.instance=inst1", "--label", "napd.spec=" + specHash(spec),
		"--pull", "never", "--network", "host",
		"--gpus", `"device=0,1"`,
		"--env", "HF_TOKEN", "--env", "VLLM_SERVER_DEV_MODE",
		"--volume", "/srv/hf:/root/.cache/huggingface:ro",
		"--ipc=host", "--shm-size", "16g",
		"vllm/vllm-openai:v0.11.0",
		"--model", "Qwen/Qwen3-8B", "--port", "8101", "--served-model-name", "Qwen 3 (8B)"}
	if !slices.Equal(got, want) {
		t.Errorf("create line\n got %q\nwant %q", got, want)
	}
	for _, a := range got {
		if strings.Contains(a, "hf_secret") {
			t.Errorf("a variable's value is on the command line: %q", a)
		}
	}
}

// podman: CDI devices, one flag per GPU; under systemd conmon and the
// container go to sub-groups of the unit (--cgroups=split); a published
// container port replaces the host network.
func TestCreateArgs_Podman(t *testing.T) {
	spec := vllmSpec()
	spec.Container.Runtime, spec.Container.Program = Podman, "/usr/bin/podman"
	spec.Container.Port = 80
	spec.Container.Pull = "missing"
	got := createArgs(spec, "inst1", true)
	for _, seq := range [][]string{
		{"--pull", "missing"},
		{"--publish", "127.0.0.1:8101:80", "--cgroups=split"},
		{"--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"},
	} {
		if !containsSeq(got, seq) {
			t.Errorf("create line %q lacks %q", got, seq)
		}
	}
	if slices.Contains(got, "--network") || slices.Contains(got, "--gpus") {
		t.Errorf("create line %q", got)
	}
	if detached := createArgs(spec, "inst1", false); slices.Contains(detached, "--cgroups=split") {
		t.Errorf("exec backend's line splits cgroups: %q", detached)
	}
}

// No GPUs asked, none passed; one docker GPU needs no inner quotes; a
// MIG instance goes by its UUID to docker, its CDI name to podman; ROCm
// gets /dev/kfd once and each render node, Intel each render node.
func TestGPUArgs(t *testing.T) {
	nv := func(id, node string) supervisor.GPU {
		return supervisor.GPU{Vendor: gpuvendor.NVIDIA, ID: id, Node: node}
	}
	amd := func(id, node string) supervisor.GPU { return supervisor.GPU{Vendor: gpuvendor.AMD, ID: id, Node: node} }
	mig := nv("MIG-8f4c2a1b-3d5e-5f60-8a7b-9c0d1e2f3a4b", "0:2")
	for _, c := range []struct {
		runtime string
		gpus    []supervisor.GPU
		want    []string
	}{
		{Docker, nil, nil},
		{Podman, nil, nil},
		{Docker, []supervisor.GPU{nv("3", "3")}, []string{"--gpus", "device=3"}},
		{Docker, []supervisor.GPU{nv("2", "2"), nv("5", "5")}, []string{"--gpus", `"device=2,5"`}},
		{Podman, []supervisor.GPU{nv("3", "3")}, []string{"--device", "nvidia.com/gpu=3"}},
		{Docker, []supervisor.GPU{mig}, []string{"--gpus", "device=" + mig.ID}},
		{Podman, []supervisor.GPU{mig}, []string{"--device", "nvidia.com/gpu=0:2"}},
		{Podman, []supervisor.GPU{amd("0", "/dev/dri/renderD128"), amd("1", "/dev/dri/renderD129")},
			[]string{"--device", "/dev/kfd", "--device", "/dev/dri/renderD128", "--device", "/dev/dri/renderD129"}},
		{Docker, []supervisor.GPU{amd("1", "/dev/dri/renderD129")}, []string{"--device", "/dev/kfd", "--device", "/dev/dri/renderD129"}},
		{Docker, []supervisor.GPU{{Vendor: gpuvendor.Intel, ID: "0", Node: "/dev/dri/renderD129"}}, []string{"--device", "/dev/dri/renderD129"}},
	} {
		if got := gpuArgs(c.runtime, c.gpus); !slices.Equal(got, c.want) {
			t.Errorf("%s %v: %q, want %q", c.runtime, c.gpus, got, c.want)
		}
	}
}

// The spec label changes with what shapes the container and not with the
// GPUs, which napd may choose anew at each wake.
func TestSpecHash(t *testing.T) {
	base := vllmSpec()
	h := specHash(base)
	same := vllmSpec()
	same.GPUs = []int{3}
	if specHash(same) != h {
		t.Error("the GPUs change the spec label")
	}
	for name, change := range map[string]func(*supervisor.Spec){
		"image":   func(s *supervisor.Spec) { s.Container.Image = "vllm/vllm-openai:v0.12.0" },
		"command": func(s *supervisor.Spec) { s.Command = append(s.Command, "--enforce-eager") },
		"env":     func(s *supervisor.Spec) { s.Environment["HF_TOKEN"] = "other" },
		"volumes": func(s *supervisor.Spec) { s.Container.Volumes = nil },
		"args":    func(s *supervisor.Spec) { s.Container.Args = []string{"--ipc=host"} },
		"port":    func(s *supervisor.Spec) { s.Port = 8102 },
		"runtime": func(s *supervisor.Spec) { s.Container.Runtime = Podman },
	} {
		s := vllmSpec()
		change(&s)
		if specHash(s) == h {
			t.Errorf("a change of %s keeps the spec label", name)
		}
	}
}

func TestStopSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "10", 1500 * time.Millisecond: "2", 30 * time.Second: "30", time.Millisecond: "1"} {
		if got := stopSeconds(supervisor.Spec{StopTimeout: d}); got != want {
			t.Errorf("%s: %s, want %s", d, got, want)
		}
	}
}

// A unit's client gets the runtime's part of napd's environment only.
func TestRuntimeEnv(t *testing.T) {
	got := runtimeEnv([]string{"PATH=/usr/bin", "CONTAINERS_CONF=/etc/c.conf", "DOCKER_HOST=unix:///d.sock", "HF_TOKEN=x", "broken"})
	if len(got) != 2 || got["CONTAINERS_CONF"] != "/etc/c.conf" || got["DOCKER_HOST"] != "unix:///d.sock" {
		t.Errorf("got %v", got)
	}
}

// The unit that runs a container: podman's start, Type=forking on conmon's
// PID file; docker's attached start; each with the runtime's stop as
// ExecStop= and a stop timeout that covers its grace.
func TestUnitSpec(t *testing.T) {
	b := inUnits{&Backend{environ: []string{"CONTAINERS_CONF=/c", "SECRET=x"}}}
	spec := vllmSpec()
	spec.Container.Runtime, spec.Container.Program = Podman, "/usr/bin/podman"
	c := b.clientOf(spec)
	u := b.unitSpec(spec, c, &inspected{ConmonPidFile: "/run/c/conmon.pid"})
	if !slices.Equal(u.Command, []string{"/usr/bin/podman", "start", "napd-engine-qwen"}) || u.PIDFile != "/run/c/conmon.pid" ||
		!slices.Equal(u.StopCommand, []string{"/usr/bin/podman", "stop", "-t", "30", "napd-engine-qwen"}) ||
		u.StopTimeout != 45*time.Second || u.Container != nil || u.GPUs != nil ||
		len(u.Environment) != 1 || u.Environment["CONTAINERS_CONF"] != "/c" || u.Port != 8101 {
		t.Errorf("podman unit: %+v", u)
	}
	spec = vllmSpec()
	u = b.unitSpec(spec, b.clientOf(spec), &inspected{})
	if !slices.Equal(u.Command, []string{"/usr/bin/docker", "start", "--attach", "napd-engine-qwen"}) || u.PIDFile != "" {
		t.Errorf("docker unit: %+v", u)
	}
}

func containsSeq(s, seq []string) bool {
	for i := 0; i+len(seq) <= len(s); i++ {
		if slices.Equal(s[i:i+len(seq)], seq) {
			return true
		}
	}
	return false
}
