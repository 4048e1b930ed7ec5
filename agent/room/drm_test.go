package room

import (
	"context"
	"errors"
	"log/slog"
	stdmaps "maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/gpuvendor"
	"github.com/napd/napd/probes/drm"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/gpu"
	"github.com/napd/napd/probes/host"
	"github.com/napd/napd/supervisor"
)

type noHost struct{}

func (noHost) Snapshot(context.Context) (host.Snapshot, error) {
	return host.Snapshot{}, errors.New("not read here")
}

// pids is a supervisor that answers each model's engine processes.
type pids map[string][]int

func (p pids) Status(_ context.Context, spec supervisor.Spec) (supervisor.Status, error) {
	return supervisor.Status{PIDs: p[spec.Model]}, nil
}
func (pids) Probe(context.Context, supervisor.Spec) error                  { return nil }
func (pids) SleepsByItself(context.Context, supervisor.Spec) (bool, error) { return false, nil }

// answer waits for a wake's answer from the desk's loop.
func answer(t *testing.T, w *wake) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the desk did not answer the wake")
	}
}

// Fit and placement on AMD devices end to end: the desk measures through
// the real probe seam reading the recorded MI300X box (its sysfs and the
// engines' fdinfo, probes/testdata/drm/mi300x). Card 1 (GPU 0) is nearly
// full with the pinned llama (vLLM, pids 4100 and its worker), card 2
// (GPU 1) holds qwen's 40 GiB. A model with gpus = "any" lands on GPU 1 and
// its engine is told ROCm's agent 1; a model fixed on GPU 0 is refused at
// once, naming llama's measured memory.
func TestDesk_AMDFitAndPlacementFromSysfs(t *testing.T) {
	r := newRig(t)
	r.prober = &measure.Prober{
		Host: noHost{},
		GPU: gpu.Combined{NVIDIA: gpu.None{}, DRM: drm.Probe{
			Sys: "../../probes/testdata/drm/mi300x/sys", Proc: "../../probes/testdata/drm/mi300x/proc"}},
		Supervisor: pids{"llama": {4100, 4101}, "qwen": {4200}},
		Scraper:    &enginemetrics.Scraper{Client: &http.Client{Timeout: time.Second}},
		Clock:      r.clock.Now, Log: slog.New(slog.DiscardHandler),
	}
	r.add("llama", 0, lifecycle.Awake, func(c *config.Model) { c.Pinned = true })
	r.add("qwen", 0, lifecycle.Awake, func(c *config.Model) { c.GPUs = []int{1} })
	placed := r.add("new", 100*GiB, lifecycle.Sleeping, func(c *config.Model) { c.GPUs, c.GPUCount = nil, 1 })
	fixed := r.add("big", 100*GiB, lifecycle.Sleeping)
	r.run()

	w := r.wake(placed, t0)
	answer(t, w)
	if w.err != nil || !slices.Equal(w.gpus, []int{1}) {
		t.Fatalf("new: %v %v, want GPU 1 (card2, 151 GiB free)", w.gpus, w.err)
	}
	devs := r.prober.GPUDevices(w.gpus)
	if want := []supervisor.GPU{{Vendor: gpuvendor.AMD, ID: "1", Node: "/dev/dri/renderD129"}}; !reflect.DeepEqual(devs, want) {
		t.Errorf("devices = %+v, want %+v", devs, want)
	}
	env := supervisor.Spec{GPUs: w.gpus, Devices: devs}.VisibleDevices()
	if want := map[string]string{"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"}; !stdmaps.Equal(env, want) {
		t.Errorf("engine environment = %v, want %v", env, want)
	}
	placed.set(func(s *model.Snapshot) { s.Lifecycle.State = lifecycle.Sleeping })

	// What each engine holds is its processes' fdinfo, each DRM client once.
	ms := r.desk.Measured()
	if got := ms.Models["llama"].GPUBytes; !stdmaps.Equal(got, map[int]int64{0: 168 * GiB}) {
		t.Errorf("llama holds %v, want 168 GiB on GPU 0", got)
	}
	if got := ms.Models["qwen"].GPUBytes; !stdmaps.Equal(got, map[int]int64{1: 40 * GiB}) {
		t.Errorf("qwen holds %v, want 40 GiB on GPU 1", got)
	}

	w = r.wake(fixed, t0)
	answer(t, w)
	var ref *gateway.Refusal
	if !errors.As(w.err, &ref) || ref.Status != http.StatusServiceUnavailable ||
		!strings.Contains(ref.Message, "cannot fit big (100.0 GiB) on GPU 0") || !strings.Contains(ref.Message, "pinned llama (168.0 GiB)") {
		t.Errorf("big on GPU 0: %v, want a 503 naming pinned llama's 168 GiB", w.err)
	}
}
