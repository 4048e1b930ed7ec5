package containers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// setup is where a scenario runs: a runtime under a supervisor.
type setup struct {
	rt         *runtime
	supervisor string // "exec" or "systemd"
	// published: container_port can be published here. A published port
	// needs the runtime's bridge network, which the tests make only in a
	// network namespace of their own (the systemd box).
	published bool
	// unitCheck, under systemd, checks the engine's unit as an operator
	// sees it (systemctl status, journalctl -u).
	unitCheck func(t *testing.T, model string)
}

// scenario is everything issue #31 asks of a container engine, run
// through one napd: wake, chat and stream; the processes and memory napd
// finds; napctl logs; a drain under a live stream; sleep by stop (the
// container is gone) and the wake after; vLLM's level-1 sleep, which keeps
// the container; the port check that passes for the container and refuses
// a squatter; a missing image and a GPU runtime that is not there (each a
// failed wake naming the runtime's own message); a published port; napd
// SIGKILLed and started again (the container adopted, or removed when the
// config changed: never two, never an orphan); napd's own stop.
func scenario(t *testing.T, s setup) {
	id := s.rt.name + "-" + s.supervisor // unique per run of the binary
	model := func(role string) string { return "ct-" + role + "-" + id }
	sm, lm, qm, pm, mm, gm := model("s"), model("l"), model("q"), model("p"), model("missing"), model("gpu")
	qPort := harness.FreePort(t)
	engine := func(name string, flags ...string) string {
		args := []string{imageEngine, "--port", "${PORT}", "--model", name, "--ttft", "5ms"}
		return quoted(append(args, flags...))
	}
	models := fmt.Sprintf(`
[models.%[1]s]
image = %[7]q
command = %[8]s
sleep = "stop"
stop_timeout = "5s"

[models.%[2]s]
image = %[7]q
command = %[9]s
environment = { VLLM_SERVER_DEV_MODE = "1" }
sleep = "vllm-l1"

[models.%[3]s]
image = %[7]q
command = %[10]s
port = %[11]d

[models.%[5]s]
image = "localhost/napd-missing:none"
command = ["/napd-demo-engine", "--port", "${PORT}"]
wake_attempts = 2

[models.%[6]s]
image = %[7]q
command = %[12]s
gpus = [0]
wake_attempts = 1
`, sm, lm, qm, pm, mm, gm, Image,
		engine(sm, "--tokens-per-second", "25"), engine(lm, "--sleep-mode"),
		quoted([]string{imageEngine, "--port", strconv.Itoa(qPort), "--model", qm}), qPort, engine(gm))
	if s.published {
		models += fmt.Sprintf("\n[models.%s]\nimage = %q\ncommand = %s\ncontainer_port = 8000\n", pm,
			Image, quoted([]string{imageEngine, "--host", "0.0.0.0", "--port", "8000", "--model", pm}))
	}
	smi := fakeSMI(t, map[string]int{sm: 1500})

	var n *harness.Napd
	t.Cleanup(func() { // after napd stopped: whatever a failed test left
		if n != nil {
			s.rt.removeAll(t, instance(t, n))
		}
	})
	n = harness.Start(t, harness.Options{Supervisor: s.supervisor, Models: models, Env: append(smi, s.rt.env...),
		Agent: fmt.Sprintf("container_runtime = %q", s.rt.name)})
	// napd writes its instance with its first container.
	inst := func() string { return instance(t, n) }
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	step(t, "wake, chat and stream")
	chatOK(t, ctx, n, sm)
	if got := stream(t, ctx, n, sm, 8); got != 8 {
		t.Fatalf("stream: %d tokens, want 8", got)
	}
	if cs := s.rt.ofModel(t, inst(), sm); len(cs) != 1 || cs[0].Name != "napd-engine-"+sm || cs[0].State.Status != "running" {
		t.Fatalf("containers of %s: %+v", sm, cs)
	}
	if s.unitCheck != nil {
		s.unitCheck(t, sm)
	}

	step(t, "memory and GPU memory attributed through the container's processes")
	waitStatus(t, n, sm, "host and GPU memory measured", func(st modelStatus) bool {
		return st.EngineBytes != nil && *st.EngineBytes > 0 && st.GPUBytes["0"] == 1500<<20
	})

	step(t, "napctl logs")
	if out, err := n.Napctl("logs", sm, "-n", "20"); err != nil || !strings.Contains(out, "msg=listening") {
		t.Fatalf("napctl logs: %v\n%s", err, out)
	}

	step(t, "a drain under a live stream, then sleep by stop: the container is gone")
	var wg sync.WaitGroup
	var tokens int
	wg.Go(func() { tokens = stream(t, ctx, n, sm, 50) }) // 2 s at 25 tokens a second
	n.WaitLeases(sm, 1, 10*time.Second)
	if out, err := n.Napctl("sleep", sm); err != nil || !strings.Contains(out, "asleep") {
		t.Fatalf("napctl sleep under a stream: %v\n%s", err, out)
	}
	wg.Wait()
	if tokens != 50 {
		t.Fatalf("the stream the drain waited for got %d tokens, want 50", tokens)
	}
	if cs := s.rt.ofModel(t, inst(), sm); len(cs) != 0 {
		t.Fatalf("asleep by stop, yet containers of %s: %+v", sm, cs)
	}

	step(t, "wake again")
	chatOK(t, ctx, n, sm)

	step(t, "vLLM's level-1 sleep keeps the container")
	chatOK(t, ctx, n, lm)
	before := s.rt.ofModel(t, inst(), lm)
	if out, err := n.Napctl("sleep", lm); err != nil || !strings.Contains(out, "asleep") {
		t.Fatalf("napctl sleep %s: %v\n%s", lm, err, out)
	}
	chatOK(t, ctx, n, lm)
	if after := s.rt.ofModel(t, inst(), lm); len(before) != 1 || len(after) != 1 || after[0].ID != before[0].ID || after[0].State.Status != "running" {
		t.Fatalf("containers before the L1 sleep %+v, after its wake %+v", before, after)
	}

	step(t, "the port check refuses a squatter, then passes for the container")
	squat, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", qPort))
	if err != nil {
		t.Fatal(err)
	}
	code, body := chat(t, ctx, n, qm)
	squat.Close()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, fmt.Sprintf("port %d is held by pid %d", qPort, os.Getpid())) {
		t.Fatalf("a squatter on the port: %d %s", code, body)
	}
	if out, err := n.Napctl("reset", qm); err != nil {
		t.Fatalf("napctl reset: %v\n%s", err, out)
	}
	chatOK(t, ctx, n, qm)

	step(t, "a missing image fails the wake, naming it")
	code, body = chat(t, ctx, n, mm)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "localhost/napd-missing:none") || !strings.Contains(body, "(2 of 2 attempts)") {
		t.Fatalf("missing image: %d %s", code, body)
	}
	t.Logf("missing image: %s", body)

	if gpuRuntime() {
		t.Log("this host has an NVIDIA runtime: the wake without one is not tried")
	} else {
		step(t, "GPUs without a GPU runtime: the runtime's own message")
		code, body = chat(t, ctx, n, gm)
		want := map[string]string{"podman": "nvidia.com/gpu=0", "docker": "could not select device driver"}[s.rt.name]
		if code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
			t.Fatalf("no GPU runtime: %d %s", code, body)
		}
		t.Logf("no GPU runtime: %s", body)
	}
	// A container that never started is removed at once, except under
	// systemd where it failed in its unit: then it stays, holding nothing,
	// until the model's next wake (or napd's next start).
	for _, c := range append(s.rt.ofModel(t, inst(), mm), s.rt.ofModel(t, inst(), gm)...) {
		if c.State.Status == "running" || s.supervisor == "exec" {
			t.Fatalf("a failed wake left a container: %+v", c)
		}
	}

	if s.published {
		step(t, "container_port: the published port passes the port check")
		chatOK(t, ctx, n, pm)
	}

	step(t, "napd SIGKILLed: its containers keep running and are adopted")
	running := map[string]string{}
	for _, c := range s.rt.containers(t, inst()) {
		if c.State.Status == "running" {
			running[c.Config.Labels["napd.model"]] = c.ID
		}
	}
	n.Kill()
	n.Launch(append(smi, s.rt.env...)...)
	if st := n.ModelStatus(lm); st.State != "awake" {
		t.Fatalf("%s after the restart: %s (%s)\n%s", lm, st.State, st.Reason, n.Log())
	}
	chatOK(t, ctx, n, lm)
	for m, id := range running {
		if cs := s.rt.ofModel(t, inst(), m); len(cs) != 1 || cs[0].ID != id {
			t.Fatalf("%s: container %s before the restart, after: %+v", m, id[:12], cs)
		}
	}
	for _, c := range s.rt.containers(t, inst()) { // what had ended is removed
		if running[c.Config.Labels["napd.model"]] != c.ID {
			t.Fatalf("after the restart, a container that was not running: %+v", c)
		}
	}

	step(t, "napd SIGKILLed and its config changed: the old container is removed, never adopted")
	n.Kill()
	n.RewriteModels(strings.Replace(models, `"--sleep-mode"`, `"--sleep-mode", "--max-num-seqs", "8"`, 1))
	n.Launch(append(smi, s.rt.env...)...)
	if cs := s.rt.ofModel(t, inst(), lm); len(cs) != 0 {
		t.Fatalf("%s's container of the old config survives: %+v", lm, cs)
	}
	chatOK(t, ctx, n, lm)
	if cs := s.rt.ofModel(t, inst(), lm); len(cs) != 1 {
		t.Fatalf("containers of %s: %+v", lm, cs)
	}

	step(t, "napd's stop")
	n.Stop()
	left := s.rt.containers(t, inst())
	if s.supervisor == "exec" && len(left) != 0 {
		t.Fatalf("napd (exec) stopped, containers left: %+v", left)
	}
	if s.supervisor == "systemd" {
		for _, c := range left { // they stay in their units, for the next napd
			if c.State.Status != "running" {
				t.Errorf("napd (systemd) stopped, container %s %s", c.Name, c.State.Status)
			}
		}
	}
}

func step(t *testing.T, what string) {
	t.Helper()
	t.Logf("--- %s", what)
}

// quoted is a TOML array of strings.
func quoted(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// instance is the napd.instance napd labels its containers with.
func instance(t *testing.T, n *harness.Napd) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.Dir, "state", "containers.json"))
	if os.IsNotExist(err) {
		return "none-yet"
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Instance string }
	if err := json.Unmarshal(data, &st); err != nil || st.Instance == "" {
		t.Fatalf("containers.json: %v %q", err, data)
	}
	return st.Instance
}

// fakeSMI puts testdata/nvidia-smi first on napd's PATH, with the models'
// GPU memory in MiB.
func fakeSMI(t *testing.T, models map[string]int) []string {
	t.Helper()
	state := filepath.Join(t.TempDir(), "smi-state")
	var b strings.Builder
	for m, mib := range models {
		fmt.Fprintf(&b, "model %s %d\n", m, mib)
	}
	if err := os.WriteFile(state, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	testdata, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv(testdataEnv); dir != "" {
		testdata = dir
	}
	return []string{"PATH=" + testdata + ":" + harness.Bin(t) + ":" + os.Getenv("PATH"), "FAKE_SMI_STATE=" + state}
}

// gpuRuntime reports whether this host could give a container a GPU.
func gpuRuntime() bool {
	for _, p := range []string{"/dev/nvidia0", "/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

func chat(t *testing.T, ctx context.Context, n *harness.Napd, model string) (int, string) {
	t.Helper()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat(model, false, 4))
	if err != nil {
		t.Fatalf("chat %s: %v", model, err)
	}
	return resp.StatusCode, string(body)
}

func chatOK(t *testing.T, ctx context.Context, n *harness.Napd, model string) {
	t.Helper()
	if code, body := chat(t, ctx, n, model); code != http.StatusOK || !strings.Contains(body, `"tok`) {
		t.Fatalf("chat %s: %d %s\n%s", model, code, body, n.Log())
	}
}

// stream sends a streamed chat and returns how many tokens came before
// [DONE]; -1 when the stream did not end with [DONE].
func stream(t *testing.T, ctx context.Context, n *harness.Napd, model string, tokens int) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL("/v1/chat/completions"), strings.NewReader(harness.Chat(model, true, tokens)))
	if err != nil {
		t.Error(err)
		return -1
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("stream %s: %v", model, err)
		return -1
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("stream %s: %s", model, resp.Status)
		return -1
	}
	got := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			return got
		}
		if strings.HasPrefix(line, "data: ") && (strings.Contains(line, `"content":"tok`) || strings.Contains(line, `"content":" tok`)) {
			got++
		}
	}
	return -1
}

// modelStatus is the part of napd's status the tests read.
type modelStatus struct {
	State       string           `json:"state"`
	EngineBytes *int64           `json:"engine_memory_bytes"`
	GPUBytes    map[string]int64 `json:"gpu_memory_bytes"`
}

// waitStatus waits until model's row of `napctl status --json` satisfies
// ok (napd measures every planner round).
func waitStatus(t *testing.T, n *harness.Napd, model, what string, ok func(modelStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		out, err := n.Napctl("status", "--json")
		if err == nil {
			var st struct {
				Models []struct {
					Name string `json:"name"`
					modelStatus
				} `json:"models"`
			}
			if err := json.Unmarshal([]byte(out), &st); err == nil {
				for _, m := range st.Models {
					if m.Name == model && ok(m.modelStatus) {
						return
					}
				}
			}
		}
		last = out
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not %s within 30s; status:\n%s", model, what, last)
}
