package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/napd/napd/agent/warmweights"
	"github.com/napd/napd/probes/pagecache"
)

// The warm-weights workload (docs/memory.md#weights-kept-warm): a stopped
// napd-demo-engine model whose --load-file weights were evicted from the
// page cache (POSIX_FADV_DONTNEED) against one whose weights napd kept
// warm, woken by a request, in alternating rounds; and a request stream to
// an awake model with and without warming running beside it.
const warmRounds = 5

// warmFigures are the workload's figures.
type warmFigures struct {
	size           int64
	workers        int
	load           string
	cold, warm     []time.Duration // wake, request sent to answer
	rewarm         []time.Duration // from the eviction to napd's warm being resident
	atWake         []float64       // share of the kept-warm weights resident at its wake
	quiet, warming []float64       // requests per second of the stream
	warmTook       []time.Duration // each warm beside the stream
}

// writeRandom writes size bytes of random data to path (no holes, nothing
// a file system compresses away: every byte is read from the disk) and
// flushes it to the disk.
func writeRandom(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	buf := make([]byte, 8<<20)
	_, _ = rand.Read(buf)
	for n := int64(0); n < size; n += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-n)]); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeWarmWeights writes size bytes to dir/w.bin (writeRandom).
func writeWarmWeights(dir string, size int64) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "w.bin")
	return path, writeRandom(path, size)
}

// startWarmNapd starts a napd with warm_weights = budget and one model
// per weights directory (named as it), each a napd-demo-engine reading its
// weights at start, and "chat", answering at once.
func startWarmNapd(binDir, budget string, dirs ...string) (*napd, error) {
	n, err := newNapd("napd", "napd-bench-warm-")
	if err != nil {
		return nil, err
	}
	engine := filepath.Join(binDir, "napd-demo-engine")
	var cfg strings.Builder
	cfg.WriteString(n.baseConfig("2m"))
	cfg.WriteString(benchPolicy)
	fmt.Fprintf(&cfg, "warm_weights = %q\n", budget)
	for _, dir := range append(dirs, "") {
		name, load := "chat", ""
		if dir != "" {
			name, load = filepath.Base(dir), fmt.Sprintf(", \"--load-file\", %q", dir)
		}
		fmt.Fprintf(&cfg, "\n[models.%s]\ncommand = [%q, \"--port\", \"${PORT}\", \"--model\", %q, \"--ttft\", \"0\", \"--tokens-per-second\", \"0\"%s]\nsleep = \"stop\"\n",
			name, engine, name, load)
		if dir != "" {
			fmt.Fprintf(&cfg, "weights = [%q]\n", dir)
		}
	}
	if err := n.launch(binDir, cfg.String(), nil); err != nil {
		return nil, err
	}
	return n, nil
}

func resident(path string) int64 {
	r, _, _ := pagecache.Cache{}.Resident(path)
	return r
}

// wakeOnce stops model, evicts its weights and, with warm, waits until
// napd has read them in again (at the stop, or its residency check within
// Recheck), then
// times a request that wakes it.
func wakeOnce(ctx context.Context, n *napd, model, weights string, size int64, warm bool) (wake, rewarm time.Duration, atWake float64, err error) {
	if err := n.sleepModel(ctx, model); err != nil {
		return 0, 0, 0, fmt.Errorf("sleep %s: %w", model, err)
	}
	if err := (pagecache.Cache{}).Drop(weights); err != nil {
		return 0, 0, 0, err
	}
	evicted := time.Now()
	if warm {
		// 90 %: this machine (a VM whose page cache shrinks with memory
		// to spare) evicts some of a file now and then; napd's next
		// check reads it in again. The table says what was resident.
		for resident(weights) < size/10*9 {
			if time.Since(evicted) > 2*time.Minute {
				return 0, 0, 0, fmt.Errorf("napd did not warm %s within 2m (%d of %d bytes resident)", model, resident(weights), size)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rewarm = time.Since(evicted)
		atWake = float64(resident(weights)) / float64(size)
	}
	start := time.Now()
	if err := post(ctx, client(), "http://"+n.addr+chatPath, small(model)); err != nil {
		return 0, 0, 0, fmt.Errorf("wake %s: %w", model, err)
	}
	return time.Since(start), rewarm, atWake, nil
}

// runWarm measures the workload with weights of size bytes.
func runWarm(ctx context.Context, o options, step func(string) func()) (*warmFigures, error) {
	dir, err := os.MkdirTemp(o.warmDir, "napd-bench-weights-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	f := &warmFigures{size: o.warmSize, workers: o.workers, load: describeMachine().load}
	done := step(fmt.Sprintf("warm weights: writing 2 × %s", gibStr(o.warmSize)))
	coldDir, warmDir := filepath.Join(dir, "cold"), filepath.Join(dir, "warm")
	coldFile, err := writeWarmWeights(coldDir, o.warmSize)
	if err != nil {
		return nil, err
	}
	warmFile, err := writeWarmWeights(warmDir, o.warmSize)
	if err != nil {
		return nil, err
	}
	done()
	// Two napds: one that keeps nothing warm, one that does (its
	// keeper would warm the evicted model's weights too).
	off, err := startWarmNapd(o.bin, "off", coldDir)
	if err != nil {
		return nil, err
	}
	defer off.stop()
	auto, err := startWarmNapd(o.bin, "auto", warmDir)
	if err != nil {
		return nil, err
	}
	defer auto.stop()
	for _, w := range []struct {
		n     *napd
		model string
	}{{off, "cold"}, {auto, "warm"}, {auto, "chat"}} {
		if err := post(ctx, client(), "http://"+w.n.addr+chatPath, small(w.model)); err != nil {
			return nil, fmt.Errorf("first wake of %s: %w", w.model, err)
		}
	}
	done = step(fmt.Sprintf("warm weights: %d alternating wakes", 2*warmRounds))
	for range warmRounds {
		d, _, _, err := wakeOnce(ctx, off, "cold", coldFile, o.warmSize, false)
		if err != nil {
			return nil, err
		}
		f.cold = append(f.cold, d)
		d, rw, at, err := wakeOnce(ctx, auto, "warm", warmFile, o.warmSize, true)
		if err != nil {
			return nil, err
		}
		f.warm, f.rewarm, f.atWake = append(f.warm, d), append(f.rewarm, rw), append(f.atWake, at)
	}
	done()
	done = step("warm weights: request stream with and without warming")
	url := "http://" + auto.addr + chatPath
	for range warmRounds {
		// A round with the warming napd does on an eviction
		// (pagecache.Warm at idle I/O priority) of the evicted 2 GiB,
		// the stream measured until its reads are all in; then a round
		// as long without it.
		if err := (pagecache.Cache{}).Drop(coldFile); err != nil {
			return nil, err
		}
		wctx, stop := context.WithCancel(ctx)
		start := time.Now()
		go func() {
			defer stop()
			if (pagecache.Cache{Rate: warmweights.Rate}).Warm(wctx, coldFile) != nil {
				return
			}
			for wctx.Err() == nil && resident(coldFile) < o.warmSize/10*9 { // as wakeOnce
				time.Sleep(5 * time.Millisecond)
			}
		}()
		rate, err := measureThroughput(wctx, url, small("chat"), o.workers, time.Minute)
		stop()
		if err != nil {
			return nil, err
		}
		took := time.Since(start)
		f.warming, f.warmTook = append(f.warming, rate), append(f.warmTook, took)
		if rate, err = measureThroughput(ctx, url, small("chat"), o.workers, took); err != nil {
			return nil, err
		}
		f.quiet = append(f.quiet, rate)
	}
	done()
	return f, nil
}

func gibStr(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func median(ds []time.Duration) time.Duration { return summarize(ds).median }

func meanRate(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// warmMarkdown renders the workload's section.
func (f *warmFigures) markdown(b *strings.Builder) {
	cold, warm := median(f.cold), median(f.warm)
	speedup := float64(cold) / float64(warm)
	quiet, warming := meanRate(f.quiet), meanRate(f.warming)
	slowdown := 100 * (1 - warming/quiet)
	fmt.Fprintf(b, `
## Weights kept warm

A stopped napd-demo-engine model reading %s of weights at start
(`+"`--load-file`"+`) is woken by a request: its weights evicted from the page
cache (`+"`POSIX_FADV_DONTNEED`"+`, under a napd with `+"`warm_weights = \"off\"`"+`)
against kept warm by napd (evicted the same way, then read in again by
napd's residency check), %d alternating rounds, load average %s at the
start. Then a request stream to an awake model (%d workers) while napd's
warming (`+"`pagecache.Warm`"+` at idle I/O and CPU priority, paced to %s/s as
napd paces it, in the bench process) reads an evicted %s file in, against a round as long without it, %d of each.

| wake | median | each round |
|---|---|---|
| weights evicted | %s | %s |
| weights kept warm | %s | %s |

napd read the evicted weights in again %s (median) after the eviction; at
the wake, %s of them were resident.

| request stream | requests/s (mean of %d) | each round |
|---|---|---|
| nothing else | %.0f | %s |
| warming beside it (each warm took %s) | %.0f | %s |

- goal: warm wake ≥ 3x faster: **%.1fx**, %s
- goal: warming slows the stream by ≤ 5 %%: **%.1f %%**, %s
`, gibStr(f.size), warmRounds, f.load, f.workers, fmt.Sprintf("%d MiB", warmweights.Rate>>20), gibStr(f.size), warmRounds,
		ms(cold), list(f.cold, ms), ms(warm), list(f.warm, ms), ms(median(f.rewarm)), list(f.atWake, pct),
		warmRounds, quiet, list(f.quiet, perSec), list(f.warmTook, ms), warming, list(f.warming, perSec), speedup, met(speedup >= 3), slowdown, met(slowdown <= 5))
}

// list writes xs with f, comma-separated.
func list[T any](xs []T, f func(T) string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = f(x)
	}
	return strings.Join(parts, ", ")
}

func pct(x float64) string    { return fmt.Sprintf("%.1f %%", 100*x) }
func perSec(x float64) string { return fmt.Sprintf("%.0f", x) }
