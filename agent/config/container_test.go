package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// withRuntimes puts executables named runtimes (and nothing else) on PATH.
func withRuntimes(t *testing.T, runtimes ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, r := range runtimes {
		if err := os.WriteFile(filepath.Join(dir, r), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	return dir
}

func TestParse_ContainerModel(t *testing.T) {
	dir := withRuntimes(t, "podman", "docker")
	cfg := mustParse(t, `
[models.vllm]
image = "docker.io/vllm/vllm-openai:v0.11.0"
command = ["--model", "Qwen/Qwen3-8B", "--port", "${PORT}"]
volumes = ["/srv/hf:/root/.cache/huggingface:ro", "models:/models"]
container_args = ["--ipc=host", "--shm-size", "16g", "--label", "team=nlp"]
pull = "missing"
gpus = [0, 1]
environment = { HF_TOKEN = "secret" }

[models.tgi]
image = "ghcr.io/huggingface/text-generation-inference:3.0"
container_runtime = "docker"
container_port = 80
port = 0
`)
	v, tgi := cfg.Models[0], cfg.Models[1]
	if v.Image != "docker.io/vllm/vllm-openai:v0.11.0" || v.ContainerRuntime != RuntimePodman || v.ContainerProgram != filepath.Join(dir, "podman") ||
		v.Pull != PullMissing || !slices.Equal(v.Volumes, []string{"/srv/hf:/root/.cache/huggingface:ro", "models:/models"}) ||
		len(v.ContainerArgs) != 5 || v.ContainerPort != 0 {
		t.Errorf("vllm: %+v", v)
	}
	if tgi.ContainerRuntime != RuntimeDocker || tgi.ContainerProgram != filepath.Join(dir, "docker") || tgi.Pull != PullNever ||
		tgi.ContainerPort != 80 || tgi.Command != nil {
		t.Errorf("tgi: %+v", tgi)
	}
}

// agent.container_runtime = "auto" takes podman when it is on PATH, else
// docker; a set runtime is used as set.
func TestParse_ContainerRuntimeChoice(t *testing.T) {
	model := "[models.m]\nimage = \"localhost/e:1\"\ncommand = [\"--port\", \"${PORT}\"]\n"
	for _, c := range []struct {
		name, agent string
		onPath      []string
		want        string
	}{
		{"auto prefers podman", "", []string{"podman", "docker"}, RuntimePodman},
		{"auto falls back to docker", "", []string{"docker"}, RuntimeDocker},
		{"agent names docker", "[agent]\ncontainer_runtime = \"docker\"\n", []string{"podman", "docker"}, RuntimeDocker},
	} {
		t.Run(c.name, func(t *testing.T) {
			withRuntimes(t, c.onPath...)
			if got := mustParse(t, c.agent+model).Models[0].ContainerRuntime; got != c.want {
				t.Errorf("runtime %q, want %q", got, c.want)
			}
		})
	}
}

// Every bad container setting is an error naming the file, the key and its
// line.
func TestParse_ContainerErrors(t *testing.T) {
	withRuntimes(t, "podman")
	head := "[models.m]\ncommand = [\"--port\", \"${PORT}\"]\n"
	for _, c := range []struct {
		name, body, key, msg string
	}{
		{"image with whitespace", `image = "localhost/e:1 --privileged"`, "models.m.image", "whitespace"},
		{"image as a flag", `image = "--privileged"`, "models.m.image", "starts with '-'"},
		{"volume without container path", `image = "e"` + "\n" + `volumes = ["/srv/hf"]`, "models.m.volumes", "no container path"},
		{"volume with a relative container path", `image = "e"` + "\n" + `volumes = ["/srv/hf:cache"]`, "models.m.volumes", "not absolute"},
		{"volume as a flag", `image = "e"` + "\n" + `volumes = ["--privileged:/x"]`, "models.m.volumes", "starts with '-'"},
		{"name in container_args", `image = "e"` + "\n" + `container_args = ["--name", "x"]`, "models.m.container_args", "napd's own"},
		{"network= in container_args", `image = "e"` + "\n" + `container_args = ["--network=bridge"]`, "models.m.container_args", "napd's own"},
		{"rm in container_args", `image = "e"` + "\n" + `container_args = ["--rm"]`, "models.m.container_args", "napd's own"},
		{"detach in container_args", `image = "e"` + "\n" + `container_args = ["-d"]`, "models.m.container_args", "napd's own"},
		{"napd label in container_args", `image = "e"` + "\n" + `container_args = ["--label", "napd.model=x"]`, "models.m.container_args", "napd's namespace"},
		{"runtime not on PATH", `image = "e"` + "\n" + `container_runtime = "docker"`, "models.m.container_runtime", "docker is not on PATH"},
		{"bad pull", `image = "e"` + "\n" + `pull = "always"`, "models.m.pull", `"never"`},
		{"container key without image", `volumes = ["/a:/b"]`, "models.m.volumes", "only used with image"},
		{"image and user", `image = "e"` + "\n" + `user = "nobody"`, "models.m.user", "--user"},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs := problems(t, head+c.body+"\n")
			if len(errs) != 1 {
				t.Fatalf("got %d problems, want 1: %v", len(errs), errs)
			}
			p := errs[0]
			if p.File != "test.toml" || p.Key != c.key || p.Line < 3 || !strings.Contains(p.Message, c.msg) {
				t.Errorf("got %s, want key %s at a line and %q", p, c.key, c.msg)
			}
		})
	}
}

func TestParse_ContainerRuntimeMissing(t *testing.T) {
	withRuntimes(t)
	errs := problems(t, "[models.m]\nimage = \"e\"\ncommand = [\"--port\", \"${PORT}\"]\n")
	if len(errs) != 1 || errs[0].Key != "models.m.image" || errs[0].Line != 2 || !strings.Contains(errs[0].Message, "neither is on PATH") {
		t.Errorf("got %v", errs)
	}
}

// A container without a command runs its image's own; with container_port
// napd publishes the port, so port = 0 needs no ${PORT}.
func TestParse_ContainerPortZero(t *testing.T) {
	withRuntimes(t, "podman")
	cfg := mustParse(t, "[models.m]\nimage = \"e\"\ncontainer_port = 8000\n")
	if m := cfg.Models[0]; m.Port != 0 || m.ContainerPort != 8000 || m.Command != nil {
		t.Errorf("got %+v", m)
	}
	errs := problems(t, "[models.m]\nimage = \"e\"\n")
	if len(errs) != 1 || errs[0].Key != "models.m.image" || !strings.Contains(errs[0].Message, "${PORT}") {
		t.Errorf("host network, port 0, no ${PORT}: %v", errs)
	}
}

func TestCheckNotes(t *testing.T) {
	cfg := &Config{Models: []*Model{
		{Name: "a", Image: "x", ContainerRuntime: "podman", ContainerProgram: "/usr/bin/podman"},
		{Name: "b", Command: []string{"engine"}},
		{Name: "c", Image: "y", ContainerRuntime: "podman", ContainerProgram: "/usr/bin/podman"},
		{Name: "d", Image: "z", ContainerRuntime: "docker", ContainerProgram: "/usr/bin/docker"},
	}}
	want := []string{"container runtime docker (/usr/bin/docker) for d", "container runtime podman (/usr/bin/podman) for a, c"}
	if got := cfg.CheckNotes(); !slices.Equal(got, want) {
		t.Errorf("got %q", got)
	}
	if got := (&Config{}).CheckNotes(); got != nil {
		t.Errorf("no containers: %q", got)
	}
}
