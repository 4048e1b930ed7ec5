package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/control"
)

// The priorities workload (issue 35): two keys, "interactive" and
// "batch", on the swap workload's two models that do not fit together. A
// continuous batch load (priorityBatchClients clients, each request
// priorityBatchTokens tokens) runs on swap-a; a person in an editor sends
// interactive requests to swap-b one after another, a pause apart. The
// figure is the interactive requests' time to the first byte of their
// stream, and the batch throughput, with and without classes.
const (
	priorityBatchClients = 4
	priorityBatchTokens  = 20
	priorityTokenRate    = "100" // tokens per second: a batch request takes ~200 ms
	priorityPause        = time.Second
	// priorityYieldAfter is the models' yield_after in both runs: how
	// long an interactive request waits behind the batch without classes.
	priorityYieldAfter = 5 * time.Second
)

const (
	interactiveKey = "sk-bench-interactive-0123456789"
	batchKey       = "sk-bench-batch-0123456789"
)

// priorityFigures is one run of the workload.
type priorityFigures struct {
	name        string
	interactive latency // time to first byte
	sent        int
	failed      int
	firstErr    error
	batchDone   int
	batchFailed int
	elapsed     time.Duration
	wakeB       time.Duration // swap-b's last wake, as napd measured it
}

// batchRate is the batch requests answered per second.
func (f priorityFigures) batchRate() float64 { return float64(f.batchDone) / f.elapsed.Seconds() }

// runPriorities runs the workload with classes (the keys' priority=,
// batch yielding at once to a higher class) or without (every request in
// the default class), interactive requests in all; interactive 0 is the
// batch load alone, for its throughput, for as long as alone.
func runPriorities(ctx context.Context, binDir string, classes bool, interactive int, alone time.Duration) (priorityFigures, error) {
	f := priorityFigures{name: "without classes (fair turns, yield_after 5 s)"}
	keys := fmt.Sprintf("interactive:%s\nbatch:%s\n", interactiveKey, batchKey)
	policy := fmt.Sprintf("yield_after = %q\n", priorityYieldAfter)
	if classes {
		f.name = "with classes (batch yields at once to interactive)"
		keys = fmt.Sprintf("interactive:%s priority=interactive\nbatch:%s priority=batch\n", interactiveKey, batchKey)
		policy += "priority_yield_after = { batch = \"0s\" }\n"
	}
	if interactive == 0 {
		f.name = "batch alone"
	}
	dir, err := os.MkdirTemp("", "napd-bench-keys-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	keysPath := filepath.Join(dir, "keys")
	if err := os.WriteFile(keysPath, []byte(keys), 0o600); err != nil {
		return f, err
	}
	n, err := startSwapNapd(binDir, fmt.Sprintf("api_keys_file = %q\n", keysPath), policy,
		"--ttft", "5ms", "--tokens-per-second", priorityTokenRate)
	if err != nil {
		return f, err
	}
	defer n.stop()
	url := "http://" + n.addr + "/v1/chat/completions"
	c := client()
	batchBody := fmt.Sprintf(`{"model":"swap-a","max_tokens":%d,"messages":[{"role":"user","content":"summarise this document"}]}`, priorityBatchTokens)
	if err := postAs(ctx, c, url, batchBody, batchKey); err != nil { // swap-a awake before the clock starts
		return f, fmt.Errorf("first batch request: %w", err)
	}

	stop := make(chan struct{})
	var done, failed atomic.Int64
	var wg sync.WaitGroup
	for range priorityBatchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := postAs(ctx, c, url, batchBody, batchKey); err != nil {
					if ctx.Err() != nil {
						return
					}
					failed.Add(1)
					continue
				}
				done.Add(1)
			}
		}()
	}
	start := time.Now()
	var ttfb []time.Duration
	if interactive == 0 {
		select {
		case <-time.After(alone):
		case <-ctx.Done():
		}
	}
	for range interactive {
		select {
		case <-time.After(priorityPause):
		case <-ctx.Done():
		}
		d, err := firstByte(ctx, c, url, `{"model":"swap-b","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"complete this line"}]}`, interactiveKey)
		f.sent++
		if err != nil {
			f.failed++
			if f.firstErr == nil {
				f.firstErr = err
			}
			continue
		}
		ttfb = append(ttfb, d)
	}
	close(stop)
	wg.Wait()
	f.elapsed = time.Since(start)
	f.batchDone, f.batchFailed = int(done.Load()), int(failed.Load())
	f.interactive = summarize(ttfb)
	if st, err := control.NewClient(n.socket).Status(ctx); err == nil {
		for _, m := range st.Models {
			if m.Name == "swap-b" {
				f.wakeB = time.Duration(m.LastWakeMs) * time.Millisecond
			}
		}
	}
	return f, nil
}

// firstByte sends a streaming request and returns the time to the first
// byte of its answer's body, reading the rest.
func firstByte(ctx context.Context, c *http.Client, url, body, key string) (time.Duration, error) {
	t := time.Now()
	resp, err := send(ctx, c, url, body, key)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadByte(); err != nil {
		return 0, err
	}
	d := time.Since(t)
	_, err = io.Copy(io.Discard, r)
	return d, err
}

// runPriorityRuns runs the batch load alone, then the workload without
// and with classes.
func (r *report) runPriorityRuns(ctx context.Context, o options, step func(string) func()) error {
	r.priorityLoad = describeMachine().load
	for _, run := range []struct {
		classes     bool
		interactive int
	}{{false, 0}, {false, o.interactive}, {true, o.interactive}} {
		done := step(fmt.Sprintf("priorities, classes=%t, interactive=%d", run.classes, run.interactive))
		f, err := runPriorities(ctx, o.bin, run.classes, run.interactive, 20*time.Second)
		if err != nil {
			return fmt.Errorf("priorities: %w", err)
		}
		r.priorities = append(r.priorities, f)
		done()
	}
	return nil
}

// priorityMarkdown renders the priorities workload's figures.
func (r *report) priorityMarkdown(b *strings.Builder) {
	if len(r.priorities) == 0 {
		return
	}
	fmt.Fprintf(b, `
## Priorities: the editor before the nightly batch

| run | interactive requests | failed | TTFB p50 | TTFB p99 | batch requests/s | batch failed | swap-b's wake |
|---|---|---|---|---|---|---|---|
`)
	alone := r.priorities[0].batchRate()
	for _, f := range r.priorities {
		rate := fmt.Sprintf("%.1f", f.batchRate())
		if f.sent > 0 && alone > 0 {
			rate += fmt.Sprintf(" (%+.0f %%)", 100*(f.batchRate()/alone-1))
		}
		p50, p99, wake := "–", "–", "–"
		if f.sent > 0 {
			p50, p99 = ms(f.interactive.median), ms(f.interactive.p99)
		}
		if f.wakeB > 0 {
			wake = ms(f.wakeB)
		}
		fmt.Fprintf(b, "| %s | %d | %d | %s | %s | %s | %d | %s |\n", f.name, f.sent, f.failed, p50, p99, rate, f.batchFailed, wake)
	}
	for _, f := range r.priorities {
		if f.firstErr != nil {
			fmt.Fprintf(b, "\n%s: the first failure: %v\n", f.name, f.firstErr)
		}
	}
	if with := r.priorities[len(r.priorities)-1]; with.sent > 0 {
		goal := with.wakeB + time.Second
		fmt.Fprintf(b, "\nGoal: with classes, the interactive p99 within swap-b's wake plus 1 s (%s): %s.\n", ms(goal), met(with.interactive.p99 <= goal))
	}
	fmt.Fprintf(b, `
The swap workload's two 16 GiB models on the fake 24 GiB GPU, two keys: %d
batch clients send %d-token chat requests to swap-a without a pause (about
200 ms each at %s tokens/s), while an interactive client streams a short
request to swap-b, %s after each answer. TTFB is from sending to the first
byte of the stream; it includes swap-a's yield (its requests in flight
finish), its engine's stop and swap-b's start. Both runs set yield_after =
%q; with classes the keys have priority=interactive and priority=batch and
[policy] priority_yield_after = { batch = "0s" }. The batch's loss is
against the batch load alone over %s; swap-b's wake is napd's last measured
one. Load average %s when the runs started.
`+"`go run ./bench -bin bin -priorities-only`"+` runs this table alone.
`, priorityBatchClients, priorityBatchTokens, priorityTokenRate, priorityPause, priorityYieldAfter.String(), "20 s", r.priorityLoad)
}
