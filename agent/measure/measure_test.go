package measure

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/probes/gpu"
)

// A failing GPU probe: the last good reading stands in while it is recent,
// then the device totals for an estimate from footprints; with no reading
// at all the fit cannot be checked. Each change is logged once.
func TestGPUReadings_FallBack(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var r gpuReadings
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	boom := errors.New("nvidia-smi: timeout")

	ms := &Measurement{At: t0}
	r.use(log, ms, gpu.Snapshot{}, boom)
	if ms.GPUFrom != GPUUnknown || !strings.Contains(ms.GPUNote, "no reading") {
		t.Errorf("never read: %v %q", ms.GPUFrom, ms.GPUNote)
	}
	good := gpu.Snapshot{Source: gpu.SourceSMI, Devices: []gpu.Device{{Index: 0, Total: 24 << 30, Free: 4 << 30, HaveMemory: true}}}
	ms = &Measurement{At: t0.Add(time.Second)}
	r.use(log, ms, good, nil)
	if ms.GPUFrom != GPULive || len(ms.GPUs.Devices) != 1 {
		t.Errorf("live: %v %v", ms.GPUFrom, ms.GPUs)
	}
	for _, after := range []time.Duration{5 * time.Second, 10 * time.Second} {
		ms = &Measurement{At: t0.Add(time.Second + after)}
		r.use(log, ms, gpu.Snapshot{}, boom)
		if ms.GPUFrom != GPURecent || ms.GPUs.Devices[0].Free != 4<<30 || !strings.Contains(ms.GPUNote, "last reading") {
			t.Errorf("after %s: %v %v %q", after, ms.GPUFrom, ms.GPUs, ms.GPUNote)
		}
	}
	ms = &Measurement{At: t0.Add(time.Second + GPUReadingMaxAge + time.Second)}
	r.use(log, ms, gpu.Snapshot{}, boom)
	if ms.GPUFrom != GPUFootprints || len(ms.GPUs.Devices) != 0 || len(ms.Totals) != 1 || ms.Totals[0].Total != 24<<30 ||
		!strings.Contains(ms.GPUNote, "learned footprints") {
		t.Errorf("old reading: %v %v %v %q", ms.GPUFrom, ms.GPUs, ms.Totals, ms.GPUNote)
	}
	ms = &Measurement{At: t0.Add(time.Minute)}
	r.use(log, ms, good, nil)
	// unknown, recent (once for two rounds), footprints; then recovery.
	if got := strings.Count(logs.String(), `msg="gpu probe failed"`); got != 3 {
		t.Errorf("%d failure lines, want 3:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "gpu probe works again") {
		t.Errorf("recovery not logged:\n%s", logs.String())
	}
}
