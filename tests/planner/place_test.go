package planner

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// placed is a demo model whose GPUs napd chooses (gpus = "any" or a count).
func placed(name, gpus, extra string) string {
	return harness.DemoModel(name, "sleep = \"stop\"\ngpus = "+gpus+"\n"+extra, "--startup-delay", "200ms", "--ttft", "10ms")
}

// statusOf is a model's row of napctl status --json.
func statusOf(t *testing.T, n *harness.Napd, name string) control.ModelStatus {
	t.Helper()
	out, err := n.Napctl("status", "--json")
	if err != nil {
		t.Fatalf("napctl status: %v\n%s", err, out)
	}
	var st control.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Models {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no model %s in status", name)
	return control.ModelStatus{}
}

// Two 24 GiB GPUs, GPU 0 partly held by another process: gpus = "any"
// lands on the freer GPU 1 (the fake nvidia-smi puts the engine's memory
// on the GPUs of its CUDA_VISIBLE_DEVICES, so status shows it there); after
// a sleep, with GPU 1 now the fuller one, the next wake keeps GPU 1, the
// set used last, because it still fits; { count = 2 } gets both GPUs.
func TestPlacement_FreerGPULastSetCountTwo(t *testing.T) {
	env := fakeGPU(t, 24<<10, map[string]int{"x": 8 << 10, "y": 4 << 10})
	setGPU(t, env, "gpus 2\nother 0 4096\n")
	n := harness.Start(t, harness.Options{
		Models: placed("x", `"any"`, `gpu_memory = "8GiB"`) + placed("y", "{ count = 2 }", `gpu_memory = "4GiB"`),
		Env:    env,
	})
	requireFakeSMI(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wake := func(model string) {
		t.Helper()
		if resp, body := post(t, n, ctx, model, 2); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
		}
	}
	// onGPUs waits until status shows the model's memory on exactly gpus.
	onGPUs := func(model string, gpus ...string) control.ModelStatus {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			s := statusOf(t, n, model)
			var got []string
			for g := range s.GPUBytes {
				got = append(got, g)
			}
			slices.Sort(got)
			if slices.Equal(got, gpus) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s holds memory on GPUs %v, want %v (status %+v)", model, got, gpus, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	wake("x")
	s := onGPUs("x", "1")
	if !slices.Equal(s.GPUs, []int{1}) || !strings.Contains(s.Placement, "the most free memory") {
		t.Errorf("x: gpus %v placement %q", s.GPUs, s.Placement)
	}
	if !regexp.MustCompile(`msg="gpus chosen" model=x gpus="?\[1\]"? fits=true why=.*GPU 1 keeps`).MatchString(n.Log()) {
		t.Errorf("the log lacks x's choice with its figures:\n%s", n.Log())
	}
	if out, err := n.Napctl("sleep", "x"); err != nil {
		t.Fatalf("napctl sleep x: %v\n%s", err, out)
	}
	onGPUs("x")
	setGPU(t, env, "other 1 6144\n") // GPU 0 now has 20 GiB free, GPU 1 18 GiB
	wake("x")
	s = onGPUs("x", "1")
	if !strings.Contains(s.Placement, "the set used last") {
		t.Errorf("x's second placement %q: want the set used last", s.Placement)
	}

	wake("y")
	s = onGPUs("y", "0", "1")
	if !slices.Equal(s.GPUs, []int{0, 1}) {
		t.Errorf("y: gpus %v", s.GPUs)
	}
	if out, err := n.Napctl("status"); err != nil || !strings.Contains(out, "y: gpus chosen: y on GPU 0,1") {
		t.Errorf("napctl status: %v\n%s", err, out)
	}
}
