package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The swap workload: two models that do not fit on the GPU together, and
// clients each asking for a random one of them. The GPU is the fake
// nvidia-smi of tests/planner (a 24 GiB device on which each running
// napd-demo-engine holds its model's size), so the figures are napd's
// scheduling, not a GPU's loading time.
const (
	swapGPUMiB   = 24 << 10
	swapModelMiB = 16 << 10
)

var swapModels = []string{"swap-a", "swap-b"}

// swapFigures is one policy's run of the workload.
type swapFigures struct {
	policy   string
	requests int
	failed   int
	firstErr error // the first failure, for the report
	elapsed  time.Duration
	swaps    int // engine starts after the first of each model
	lat      latency
	// napdShare: per swap, from the holder's last answered byte to the
	// waiter's engine start (napd run only); stopGap: from the holder's
	// engine exit to that start.
	napdShare, stopGap latency
}

// startSwapNapd starts a napd from binDir with the two swap models on the
// fake GPU; gateway and policy are more lines of those tables, flags the
// engines' own.
func startSwapNapd(binDir, gateway, policy string, flags ...string) (*napd, error) {
	n, err := newNapd("napd", "napd-bench-swap-")
	if err != nil {
		return nil, err
	}
	state := filepath.Join(n.dir, "gpu-state")
	smi, err := filepath.Abs(filepath.Join("tests", "planner", "testdata"))
	if err != nil {
		return nil, err
	}
	gpu := fmt.Sprintf("total %d\n", swapGPUMiB)
	var cfg strings.Builder
	cfg.WriteString(n.baseConfig("2m"))
	cfg.WriteString(gateway)
	cfg.WriteString(benchPolicy)
	cfg.WriteString(policy)
	var args strings.Builder
	for _, f := range flags {
		fmt.Fprintf(&args, ", %q", f)
	}
	for _, m := range swapModels {
		gpu += fmt.Sprintf("model %s %d\n", m, swapModelMiB)
		fmt.Fprintf(&cfg, `
[models.%s]
command = [%q, "--host", "127.0.0.1", "--port", "${PORT}", "--model", %q%s]
sleep = "stop"
gpus = [0]
gpu_memory = "%dMiB"
`, m, filepath.Join(binDir, "napd-demo-engine"), m, args.String(), swapModelMiB)
	}
	if err := os.WriteFile(state, []byte(gpu), 0o644); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(smi, "nvidia-smi")); err != nil {
		return nil, fmt.Errorf("the fake nvidia-smi (run the bench from the repository root): %w", err)
	}
	env := []string{"PATH=" + smi + ":" + os.Getenv("PATH"), "FAKE_SMI_STATE=" + state}
	if err := n.launch(binDir, cfg.String(), env); err != nil {
		return nil, err
	}
	return n, nil
}

// swapPolicy sends one request for model and returns when it is answered.
type swapPolicy func(ctx context.Context, model string) error

// runSwaps starts a napd with the two models on the fake GPU and runs the
// workload through it: clients × each requests, each for a random model.
// naive makes the clients take turns one request at a time, swapping
// whenever the next request's model is not the one loaded, as a proxy that
// swaps per request does; otherwise napd schedules them.
func runSwaps(ctx context.Context, binDir string, clients, each int, naive bool) (swapFigures, error) {
	f := swapFigures{policy: "napd (wait for room, fair turns, batches)"}
	if naive {
		f.policy = "naive: one request at a time, swap whenever the model changes"
	}
	n, err := startSwapNapd(binDir, "", "", "--ttft", "5ms", "--tokens-per-second", "0")
	if err != nil {
		return f, err
	}
	stopped := false
	defer func() {
		if !stopped {
			n.stop()
		}
	}()

	url := "http://" + n.addr + "/v1/chat/completions"
	c := client()
	send := func(ctx context.Context, model string) error { return post(ctx, c, url, small(model)) }
	policy := swapPolicy(send)
	if naive {
		var mu sync.Mutex
		loaded := ""
		policy = func(ctx context.Context, model string) error {
			mu.Lock()
			defer mu.Unlock()
			if loaded != "" && loaded != model {
				if err := n.sleepModel(ctx, loaded); err != nil {
					return err
				}
			}
			loaded = model
			return send(ctx, model)
		}
	}

	type done struct {
		model string
		at    time.Time
	}
	var mu sync.Mutex
	var lats []time.Duration
	var answers []done
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		rng := rand.New(rand.NewPCG(uint64(i), 42))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				model := swapModels[rng.IntN(len(swapModels))]
				t := time.Now()
				err := policy(ctx, model)
				now := time.Now()
				mu.Lock()
				if err != nil {
					f.failed++
					if f.firstErr == nil {
						f.firstErr = err
					}
				} else {
					lats = append(lats, now.Sub(t))
					answers = append(answers, done{model, now})
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	f.elapsed = time.Since(start)
	f.requests = clients * each
	f.lat = summarize(lats)
	n.stop() // the log is complete once napd has exited
	stopped = true

	starts, exits := engineEvents(n.log.String())
	f.swaps = max(len(starts)-1, 0) // the models never fit together: every start but the first is a swap
	var shares, gaps []time.Duration
	for _, s := range starts {
		// The holder is the other model: its last answer and its engine's
		// exit before this start.
		var last, exit time.Time
		for _, a := range answers {
			if a.model != s.model && a.at.Before(s.at) && a.at.After(last) {
				last = a.at
			}
		}
		for _, e := range exits {
			if e.model != s.model && e.at.Before(s.at) && e.at.After(exit) {
				exit = e.at
			}
		}
		if !last.IsZero() && !naive {
			shares = append(shares, s.at.Sub(last))
		}
		if !exit.IsZero() {
			gaps = append(gaps, s.at.Sub(exit))
		}
	}
	f.napdShare, f.stopGap = summarize(shares), summarize(gaps)
	return f, nil
}

type engineEvent struct {
	model string
	at    time.Time
}

// engineEvents reads the engine starts and stops from napd's log.
func engineEvents(log string) (starts, stops []engineEvent) {
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		started := strings.Contains(line, `msg="engine started"`)
		if !started && !strings.Contains(line, `msg="engine stopped"`) {
			continue
		}
		var ev engineEvent
		for _, field := range strings.Fields(line) {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "time":
				ev.at, _ = time.Parse(time.RFC3339Nano, v)
			case "model":
				ev.model = v
			}
		}
		if started {
			starts = append(starts, ev)
		} else {
			stops = append(stops, ev)
		}
	}
	slices.SortFunc(starts, func(a, b engineEvent) int { return a.at.Compare(b.at) })
	return starts, stops
}
