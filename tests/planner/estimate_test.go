package planner

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// Before its first wake a model without gpu_memory has its footprint
// estimated: from the .gguf file its command names (a sparse 10 GiB fixture:
// 10 × 1.2 + 1 = 13 GiB) or from vLLM's --gpu-memory-utilization (0.9 × the
// 24 GiB GPU). Status marks both "estimated"; the first wake replaces g's
// by the measured 6 GiB; and fit-before-wake uses the estimate: big's
// 21.6 GiB cannot fit next to pinned g, so its wake is refused at once.
func TestEstimate_FromFilesAndUtilizationUntilMeasured(t *testing.T) {
	gguf := filepath.Join(t.TempDir(), "g.Q4_K_M.gguf")
	f, err := os.Create(gguf)
	if err == nil {
		err = f.Truncate(10 << 30)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	env := fakeGPU(t, 24<<10, map[string]int{"g": 6 << 10, "big": 20 << 10})
	n := harness.Start(t, harness.Options{
		Models: harness.DemoModel("g", "sleep = \"stop\"\ngpus = [0]\npinned = true\n", "--model", gguf) +
			harness.DemoModel("big", "sleep = \"stop\"\ngpus = [0]\n", "--gpu-memory-utilization", "0.9"),
		Env: env,
	})
	requireFakeSMI(t, n)
	const GiB = 1 << 30
	if s := statusOf(t, n, "g"); s.FootprintSource != control.FootprintEstimated || s.Footprint != 13*GiB || !strings.Contains(s.FootprintFrom, "10.0 GiB of .gguf") {
		t.Errorf("g before its wake: %d %s %q", s.Footprint, s.FootprintSource, s.FootprintFrom)
	}
	// The utilization estimate needs the GPU's total: the first reading.
	deadline := time.Now().Add(10 * time.Second)
	for s := statusOf(t, n, "big"); s.Footprint != 24*GiB*9/10; s = statusOf(t, n, "big") {
		if time.Now().After(deadline) {
			t.Fatalf("big: %d %s %q, want 0.9 × 24 GiB estimated", s.Footprint, s.FootprintSource, s.FootprintFrom)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := n.Napctl("status"); err != nil || !strings.Contains(out, "big: footprint 21.6GiB estimated from --gpu-memory-utilization 0.9") {
		t.Errorf("napctl status: %v\n%s", err, out)
	}
	n.WaitLog(`msg="footprint estimated" model=g bytes=13958643712 from=`, 5*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if resp, body := post(t, n, ctx, "g", 2); resp.StatusCode != http.StatusOK {
		t.Fatalf("g: %d %s", resp.StatusCode, body)
	}
	n.WaitLog(`msg="footprint measured" model=g bytes=6442450944 replaces=13958643712`, 20*time.Second)
	if s := statusOf(t, n, "g"); s.FootprintSource != control.FootprintMeasured || s.Footprint != 6*GiB {
		t.Errorf("g after its wake: %d %s", s.Footprint, s.FootprintSource)
	}
	resp, body := post(t, n, ctx, "big", 2)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "cannot fit big (21.6 GiB)") || !strings.Contains(body, "pinned g (6.0 GiB)") {
		t.Errorf("big: %d %s", resp.StatusCode, body)
	}
}
