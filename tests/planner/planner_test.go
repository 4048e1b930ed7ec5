// Package planner runs napd's fit-before-wake end to end: demo engines on a
// fake GPU whose memory a fake nvidia-smi (testdata/nvidia-smi) reports
// from the engine processes that really run.
package planner

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// fakeGPU writes the fake GPU's state file (its size and each model's
// footprint, in MiB) that testdata/nvidia-smi reads, and returns napd's
// environment with that script first on PATH.
func fakeGPU(t *testing.T, totalMiB int, models map[string]int) []string {
	t.Helper()
	state := filepath.Join(t.TempDir(), "gpu-state")
	var b strings.Builder
	fmt.Fprintf(&b, "total %d\n", totalMiB)
	for name, mib := range models {
		fmt.Fprintf(&b, "model %s %d\n", name, mib)
	}
	if err := os.WriteFile(state, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	testdata, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return []string{
		"PATH=" + testdata + ":" + harness.Bin(t) + ":" + os.Getenv("PATH"),
		"FAKE_SMI_STATE=" + state,
	}
}

// requireFakeSMI checks napd measures the fake GPU. On a host with a real
// NVIDIA driver napd prefers NVML and the fake is never asked: skip there.
func requireFakeSMI(t *testing.T, n *harness.Napd) {
	t.Helper()
	switch n.GPUSource(10 * time.Second) {
	case "nvml":
		t.Skip("a real NVML is loaded on this host: the fake nvidia-smi is not used")
	case "nvidia-smi":
	default:
		t.Fatalf("napd does not use the fake nvidia-smi:\n%s", n.Log())
	}
}

func demo(name, extra string) string {
	return harness.DemoModel(name, "sleep = \"stop\"\ngpus = [0]\n"+extra, "--startup-delay", "200ms", "--ttft", "10ms")
}

func post(t *testing.T, n *harness.Napd, ctx context.Context, model string, maxTokens int) (*http.Response, string) {
	t.Helper()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat(model, false, maxTokens))
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

func metric(t *testing.T, n *harness.Napd, line string) bool {
	t.Helper()
	return strings.Contains(n.MetricsText(), line)
}

// A 20 GiB model does not fit next to an idle 10 GiB one on a 24 GiB GPU:
// napd puts the idle one to sleep first (make-room), waits until the GPU
// shows its memory back, then wakes the large one, and the request gets 200.
func TestPlanner_WakePutsIdleModelToSleepFirst(t *testing.T) {
	env := fakeGPU(t, 24<<10, map[string]int{"small": 10 << 10, "big": 20 << 10})
	// small's idle minimum is half its idle_timeout: 3s after its last use
	// it may be evicted to make room, and the idle rule cannot take it
	// before 6s.
	n := harness.Start(t, harness.Options{
		Models: demo("small", `gpu_memory = "10GiB"`+"\nidle_timeout = \"6s\"") + demo("big", `gpu_memory = "20GiB"`),
		Env:    env,
	})
	requireFakeSMI(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if resp, body := post(t, n, ctx, "small", 2); resp.StatusCode != http.StatusOK {
		t.Fatalf("small: %d %s", resp.StatusCode, body)
	}
	time.Sleep(3500 * time.Millisecond)

	resp, body := post(t, n, ctx, "big", 2)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("big: %d %s", resp.StatusCode, body)
	}
	// In order: the make-room decision, small's engine gone, big's started.
	steps := []string{`msg="planner decision" model=small .*decision.reason=make-room`,
		`msg="engine stopped" backend=exec model=small`, `msg="engine started" backend=exec model=big`}
	next := 0
	for _, line := range harness.Lines(n.Log()) {
		if next < len(steps) && regexp.MustCompile(steps[next]).MatchString(line) {
			next++
		}
	}
	if next < len(steps) {
		t.Fatalf("the log lacks, in order, %q", steps[next])
	}
	if !metric(t, n, `napd_planner_decisions_total{action="sleep",model="small",reason="make-room"} 1`) {
		t.Error("metrics show no make-room decision for small")
	}
	if out, err := n.Napctl("status"); err != nil || !strings.Contains(out, "sleeping") || !strings.Contains(out, "awake") {
		t.Errorf("napctl status: %v\n%s", err, out)
	}
}

// A wake that cannot fit even once the busy model (mid-stream) is done,
// because a pinned one holds the rest, puts nothing to sleep and does not
// wait: the request gets 503 with Retry-After and a message naming the
// pinned model and how much it holds.
func TestPlanner_WakeThatCannotFitNamesTheHolders(t *testing.T) {
	env := fakeGPU(t, 24<<10, map[string]int{"small": 10 << 10, "pin": 4 << 10, "big": 20 << 10})
	n := harness.Start(t, harness.Options{
		Models: demo("small", `gpu_memory = "10GiB"`) + demo("pin", "gpu_memory = \"4GiB\"\npinned = true") +
			demo("big", `gpu_memory = "20GiB"`),
		Env: env,
	})
	requireFakeSMI(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if resp, body := post(t, n, ctx, "pin", 1); resp.StatusCode != http.StatusOK {
		t.Fatalf("pin: %d %s", resp.StatusCode, body)
	}
	// A long stream keeps small busy while big asks to wake.
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	req, _ := http.NewRequestWithContext(streamCtx, http.MethodPost, n.URL("/v1/chat/completions"),
		strings.NewReader(harness.Chat("small", true, 5000)))
	req.Header.Set("Content-Type", "application/json")
	stream, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if _, err := stream.Body.Read(make([]byte, 1)); err != nil || stream.StatusCode != http.StatusOK {
		t.Fatalf("small's stream: %d %v", stream.StatusCode, err)
	}

	resp, body := post(t, n, ctx, "big", 2)
	want := "cannot fit big (20.0 GiB) on GPU 0 (24.0 GiB, gpu_reserve 1.0 GiB): held by pinned pin (4.0 GiB), which waiting cannot free"
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, want) {
		t.Fatalf("big: status %d Retry-After %q body %s\nwant the message %q", resp.StatusCode, resp.Header.Get("Retry-After"), body, want)
	}
	if strings.Contains(n.Log(), `msg="planner decision"`) {
		t.Error("a model was put to sleep for a wake that cannot fit")
	}
	if out, err := n.Napctl("status"); err != nil || strings.Count(out, "awake") != 2 {
		t.Errorf("small and pin must stay awake: %v\n%s", err, out)
	}
}

// setGPU rewrites the fake GPU's state file (see fakeGPU) with extra lines.
func setGPU(t *testing.T, env []string, lines string) {
	t.Helper()
	for _, e := range env {
		if path, ok := strings.CutPrefix(e, "FAKE_SMI_STATE="); ok {
			old, err := os.ReadFile(path)
			if err == nil {
				err = os.WriteFile(path+".new", append(old, lines...), 0o644)
			}
			if err == nil {
				err = os.Rename(path+".new", path)
			}
			if err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("no FAKE_SMI_STATE")
}

// A GPU probe that fails does not open the gate: the wake of a model that
// does not fit next to a pinned one is refused with the last good reading,
// and the refusal and the log say the probe fails. Once the probe answers
// again, so do the figures.
func TestPlanner_FailingProbeDoesNotOpenTheGate(t *testing.T) {
	for _, mode := range []string{"fail", "hang"} {
		t.Run(mode, func(t *testing.T) {
			env := fakeGPU(t, 24<<10, map[string]int{"pin": 10 << 10, "big": 20 << 10})
			n := harness.Start(t, harness.Options{
				Models: demo("pin", "gpu_memory = \"10GiB\"\npinned = true") + demo("big", `gpu_memory = "20GiB"`),
				Env:    env,
			})
			requireFakeSMI(t, n)
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			if resp, body := post(t, n, ctx, "pin", 1); resp.StatusCode != http.StatusOK {
				t.Fatalf("pin: %d %s", resp.StatusCode, body)
			}
			setGPU(t, env, mode+"\n")
			resp, body := post(t, n, ctx, "big", 2)
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "cannot fit big (20.0 GiB) on GPU 0") ||
				!strings.Contains(body, "the GPU probe fails; checked against its last reading") {
				t.Fatalf("big with a failing probe: %d %s", resp.StatusCode, body)
			}
			n.WaitLog(`msg="gpu probe failed"`, 5*time.Second)
			if strings.Contains(n.Log(), `msg="engine started" backend=exec model=big`) {
				t.Error("big's engine was started while the GPU could not be read")
			}
		})
	}
}
