package model

import (
	"slices"
	"testing"

	"github.com/napd/napd/agent/config"
)

// A model with an image gets a container spec (its runtime as the config
// resolved it) and no engine user: the runtime's client runs as napd, the
// container as its image's user.
func TestSpecOf_Container(t *testing.T) {
	mc := &config.Model{
		Name: "vllm", Image: "vllm/vllm-openai:v0.11.0", ContainerRuntime: "podman", ContainerProgram: "/usr/bin/podman",
		Command: []string{"--port", "${PORT}"}, Volumes: []string{"/srv/hf:/root/.cache/huggingface", "/run/e-${PORT}:/run/e"},
		ContainerArgs: []string{"--ipc=host", "--label=port=${PORT}"}, Pull: "never", GPUs: []int{1},
	}
	spec := SpecOf(mc, 8101)
	c := spec.Container
	if c == nil || c.Runtime != "podman" || c.Program != "/usr/bin/podman" || c.Image != mc.Image || c.Pull != "never" ||
		!slices.Equal(c.Volumes, []string{"/srv/hf:/root/.cache/huggingface", "/run/e-8101:/run/e"}) ||
		!slices.Equal(c.Args, []string{"--ipc=host", "--label=port=8101"}) || c.Port != 0 {
		t.Fatalf("container %+v", c)
	}
	if !slices.Equal(spec.Command, []string{"--port", "8101"}) || spec.User != "" || !slices.Equal(spec.GPUs, []int{1}) {
		t.Errorf("spec %+v", spec)
	}
	if s := SpecOf(&config.Model{Name: "p", Command: []string{"engine"}}, 1); s.Container != nil {
		t.Errorf("a process engine got a container: %+v", s.Container)
	}
}
