// Command bench measures napd's gateway on this machine and writes the
// figures, with the machine they were taken on, to docs/bench.md:
//
//  1. proxy cost: a small non-streamed request through napd to an awake
//     engine on loopback versus straight to the same engine (latency and
//     throughput, side by side in one run);
//  2. streams: how long each SSE chunk spends in napd, and napd's memory
//     with 2,000 streams open at once;
//  3. wake: how soon after its engine turns healthy a waiting request is
//     answered;
//  4. recording: what the request metrics and the token counting add to
//     each request, against napd's CPU per request from 1;
//  5. swaps: two models that do not fit on the GPU together (a fake
//     nvidia-smi), clients asking for a random one, napd's scheduling
//     against a naive swap-per-request policy;
//  6. priorities: on those two models, a batch load on one and an
//     interactive client on the other, time to first byte and batch
//     throughput with and without priority classes;
//  7. load progress: a model whose engine reads 1 GiB of evicted weights
//     at start, the error of napd's time left at 25, 50 and 75 % of it.
//
// The engine is this program itself run with -engine: a minimal server
// whose own cost is negligible and which stamps every chunk with its send
// time. With -llama-server and -gguf, wrk measures the proxy cost on
// llama.cpp's llama-server too; with -napd-b, a second napd binary is
// measured beside the first in the wrk tables. `make bench` builds napd
// and runs `go run ./bench -bin bin`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

func main() {
	var ef engineFlags
	engine := flag.Bool("engine", false, "run as the bench engine (napd starts it)")
	goproxy := flag.String("goproxy", "", "run as the stock Go proxy listening on this address (the bench starts it)")
	floor := flag.String("floor", "", "run as the Go floor listening on this address (the bench starts it)")
	target := flag.String("target", "", "goproxy: the engine's URL; floor: its host:port")
	flag.IntVar(&ef.port, "port", 0, "engine: port")
	flag.DurationVar(&ef.startupDelay, "startup-delay", 0, "engine: time until /health turns 200")
	flag.StringVar(&ef.readyFile, "ready-file", "", "engine: file to write the healthy moment to")
	flag.IntVar(&ef.procs, "procs", 0, "engine: GOMAXPROCS (0 = Go's default)")
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory holding the napd binary")
	flag.StringVar(&o.out, "out", "docs/bench.md", "figures file to write (\"\" = print only)")
	flag.IntVar(&o.requests, "requests", 3000, "sequential requests per path for the latency figures")
	flag.IntVar(&o.workers, "workers", 16, "concurrent clients for the throughput figures")
	flag.DurationVar(&o.throughputFor, "throughput-for", 2*time.Second, "duration of each throughput round")
	flag.IntVar(&o.streams, "streams", 2000, "streams held open at once for the memory figure")
	flag.IntVar(&o.swapClients, "swap-clients", 8, "concurrent clients of the swap workload")
	flag.IntVar(&o.swapRequests, "swap-requests", 25, "requests per client of the swap workload")
	flag.BoolVar(&o.swapsOnly, "swaps-only", false, "run only the swap workload and print its figures")
	flag.IntVar(&o.interactive, "interactive", 12, "interactive requests per run of the priorities workload")
	flag.BoolVar(&o.prioritiesOnly, "priorities-only", false, "run only the priorities workload and print its figures")
	flag.BoolVar(&o.warmOnly, "warm-only", false, "run only the warm-weights workload and print its figures")
	flag.Int64Var(&o.warmSize, "warm-size", 2<<30, "warm-weights workload: bytes of each model's weights file")
	flag.StringVar(&o.warmDir, "warm-dir", "", "warm-weights workload: directory on the disk to measure (empty: the temporary directory; not a tmpfs)")
	flag.BoolVar(&o.wrkOnly, "wrk-only", false, "run only the wrk comparisons (the real engine's too) and print their figures")
	flag.BoolVar(&o.realOnly, "real-only", false, "run only the real-engine comparison and print its figures")
	flag.StringVar(&o.llamaServer, "llama-server", "", "llama.cpp's llama-server binary: the real-engine comparison runs on it (with -gguf)")
	flag.StringVar(&o.gguf, "gguf", "", "the GGUF model llama-server serves in the real-engine comparison")
	flag.StringVar(&o.binB, "napd-b", "", "a second directory holding a napd binary: its napd is measured beside the first in the wrk comparisons (\"napd (B)\")")
	flag.BoolVar(&o.progressOnly, "progress-only", false, "run only the load-progress rounds and print their figures")
	flag.IntVar(&o.progressRounds, "progress-rounds", 3, "wakes of the load-progress figure")
	flag.StringVar(&o.progressDir, "progress-dir", "", "directory on a disk for the load-progress weights file (\"\" = the temporary directory)")
	flag.Parse()
	if *goproxy != "" {
		if err := runGoProxy(*goproxy, *target); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if *floor != "" {
		fmt.Fprintln(os.Stderr, runFloor(*floor, *target)) // serves until it fails
		os.Exit(1)
	}
	if *engine {
		if err := runEngine(ef); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the driver's flags.
type options struct {
	bin            string
	out            string
	requests       int
	workers        int
	throughputFor  time.Duration
	streams        int
	swapClients    int
	swapRequests   int
	swapsOnly      bool
	interactive    int
	prioritiesOnly bool
	warmOnly       bool
	warmSize       int64
	warmDir        string
	wrkOnly        bool
	realOnly       bool
	llamaServer    string
	gguf           string
	binB           string // "" = no A/B comparison
	progressOnly   bool
	progressRounds int
	progressDir    string
}

func run(o options) error {
	switch {
	case o.warmOnly:
		return alone(&report{}, 15*time.Minute, func(ctx context.Context, r *report) (err error) { r.warm, err = runWarm(ctx, o, step); return err },
			func(r *report, b *strings.Builder) { r.warm.markdown(b) })
	case o.progressOnly:
		return alone(&report{}, 10*time.Minute, func(ctx context.Context, r *report) error { return r.runProgress(ctx, o, step) },
			(*report).progressMarkdown)
	case o.prioritiesOnly:
		return alone(&report{}, 10*time.Minute, func(ctx context.Context, r *report) error { return r.runPriorityRuns(ctx, o, step) },
			(*report).priorityMarkdown)
	case o.swapsOnly:
		quiet := func(string) func() { return func() {} }
		return alone(&report{swapClients: o.swapClients, swapEach: o.swapRequests}, 5*time.Minute,
			func(ctx context.Context, r *report) error { return r.runSwaps(ctx, o, quiet) }, (*report).swapMarkdown)
	}
	// Thousands of streams need thousands of descriptors here, in napd
	// (which inherits this limit) and in the engine.
	// 10,000 streams take 20,000 in napd: as root, the hard limit is
	// raised too.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		want := lim
		want.Max = max(lim.Max, 65536)
		want.Cur = want.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) != nil && lim.Cur < lim.Max {
			lim.Cur = lim.Max
			_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		}
	}
	nofile := uint64(0)
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		nofile = lim.Cur
	}
	real, err := newRealEngine(o.llamaServer, o.gguf)
	if err != nil {
		return err
	}
	if o.realOnly && real == nil {
		return errors.New("-real-only needs -llama-server and -gguf")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	n, err := startNapd(o.bin, self, real)
	if err != nil {
		return err
	}
	defer n.stop()
	var nb *napd // the A/B comparison's second napd
	if o.binB != "" {
		if nb, err = startNapdB(o.binB, self, real); err != nil {
			return fmt.Errorf("-napd-b: %w", err)
		}
		defer nb.stop()
	}
	// The whole bench takes about seven minutes on the 2-CPU machine, four
	// and a half of them wrk's rounds, and two more with napd B and the
	// real engine; the deadline only ends a run that hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	r := &report{machine: describeMachine(), streamsWanted: o.streams, workers: o.workers,
		swapClients: o.swapClients, swapEach: o.swapRequests}
	direct := fmt.Sprintf("http://127.0.0.1:%d%s", n.engines["proxy"], chatPath)
	viaNapd := "http://" + n.addr + chatPath

	if !o.realOnly {
		done := step("wrk: direct, nginx, the Go proxies, napd")
		if r.wrk, err = wrkSection(ctx, n, nb); err != nil {
			return err
		}
		done()
		done = step("allocations per request (go test -bench)")
		if r.allocs, err = gatewayAllocs(ctx); err != nil {
			return err
		}
		done()
	}
	if real == nil {
		r.real.skipped = noRealEngine
		fmt.Fprintf(os.Stderr, "bench: the real-engine table is skipped: %s\n", noRealEngine)
	} else {
		done := step("real engine: direct, nginx, the Go proxies, napd")
		if r.real, err = realSection(ctx, n, nb, real); err != nil {
			return err
		}
		done()
	}
	if o.wrkOnly || o.realOnly {
		var b strings.Builder
		if !o.realOnly {
			r.wrkMarkdown(&b)
		}
		r.realMarkdown(&b)
		fmt.Print(b.String())
		return nil
	}

	for _, e := range []struct{ model, engine, direct string }{
		{"proxy", "minimal engine (bench -engine)", direct},
		{"demo", "napd-demo-engine --ttft 0 --tokens-per-second 0", fmt.Sprintf("http://127.0.0.1:%d%s", n.engines["demo"], chatPath)},
	} {
		f, err := proxyCost(ctx, o, n, step, e.model, e.direct, viaNapd)
		if err != nil {
			return err
		}
		f.engine = e.engine
		r.proxy = append(r.proxy, f)
	}

	done := step("per-chunk delay")
	const streams, chunks, interval = 20, 50, 2 * time.Millisecond
	dd, err := chunkDelays(ctx, direct, streams, chunks, interval)
	if err != nil {
		return fmt.Errorf("chunks direct: %w", err)
	}
	vv, err := chunkDelays(ctx, viaNapd, streams, chunks, interval)
	if err != nil {
		return fmt.Errorf("chunks via napd: %w", err)
	}
	r.chunkDirect, r.chunkNapd, r.chunks = summarize(dd), summarize(vv), len(vv)
	done()

	done = step(fmt.Sprintf("%d open streams", o.streams))
	r.rssIdle, _, _ = n.memory()
	r.streamsOpen, err = openStreams(ctx, viaNapd, o.streams, time.Second, func() {
		for range 5 { // the largest of a few samples a chunk interval apart
			rss, _, _ := n.memory()
			r.rssStreams = max(r.rssStreams, rss)
			time.Sleep(200 * time.Millisecond)
		}
	})
	if err != nil {
		return fmt.Errorf("open streams: %w", err)
	}
	_, r.rssPeak, _ = n.memory()
	done()

	r.scale.nofile = nofile
	done = step(fmt.Sprintf("%d open streams", manyStreamsWant))
	r.scale.manyOpen, err = openStreams(ctx, viaNapd, manyStreamsWant, time.Second, func() {
		for range 5 {
			rss, _, _ := n.memory()
			r.scale.manyRSS = max(r.scale.manyRSS, rss)
			time.Sleep(200 * time.Millisecond)
		}
	})
	if err != nil {
		return fmt.Errorf("open streams: %w", err)
	}
	_, r.scale.manyPeak, _ = n.memory()
	// The next figures are another napd's: this one first finishes
	// closing the streams, which would otherwise share the CPU with them.
	n.settle(10 * time.Second)
	done()

	done = step(fmt.Sprintf("%d models asleep", scaleModels))
	if err := measureScale(ctx, o.bin, self, &r.scale); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	done()

	done = step("wakes")
	for range 2 {
		for _, d := range wakeDelays {
			f, err := measureWake(ctx, n, d)
			if err != nil {
				return err
			}
			r.wakes = append(r.wakes, f)
		}
	}
	done()

	done = step("recording cost")
	r.record = measureRecording()
	r.record.streamCPU, err = streamCPU(ctx, n, viaNapd, 400, 16, r.record.chunks, time.Millisecond)
	if err != nil {
		return fmt.Errorf("stream CPU: %w", err)
	}
	done()

	if err := r.runSwaps(ctx, o, step); err != nil {
		return err
	}
	if err := r.runPriorityRuns(ctx, o, step); err != nil {
		return err
	}
	if r.warm, err = runWarm(ctx, o, step); err != nil {
		return fmt.Errorf("warm weights: %w", err)
	}
	if err := r.runProgress(ctx, o, step); err != nil {
		return err
	}

	md := r.markdown()
	fmt.Print(md)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(md), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench: figures written to %s\n", o.out)
	}
	return nil
}

// step says on stderr that the bench starts name; the function it
// returns says how long it took.
func step(name string) func() {
	fmt.Fprintf(os.Stderr, "bench: %s…", name)
	t := time.Now()
	return func() { fmt.Fprintf(os.Stderr, " %s\n", time.Since(t).Round(time.Millisecond)) }
}

// alone runs one workload by itself into r (an -…-only flag), within a
// deadline, and prints its figures as render writes them.
func alone(r *report, within time.Duration, run func(context.Context, *report) error, render func(*report, *strings.Builder)) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := run(ctx, r); err != nil {
		return err
	}
	var b strings.Builder
	render(r, &b)
	fmt.Print(b.String())
	return nil
}

// runSwaps runs the swap workload under napd and under the naive policy.
func (r *report) runSwaps(ctx context.Context, o options, step func(string) func()) error {
	r.swapLoad = describeMachine().load
	for _, naive := range []bool{false, true} {
		done := step(fmt.Sprintf("swaps, naive=%t", naive))
		f, err := runSwaps(ctx, o.bin, o.swapClients, o.swapRequests, naive)
		if err != nil {
			return fmt.Errorf("swaps: %w", err)
		}
		r.swaps = append(r.swaps, f)
		done()
	}
	return nil
}

// proxyCost takes the latency and throughput figures of model, straight to
// its engine and through napd.
func proxyCost(ctx context.Context, o options, n *napd, step func(string) func(), model, direct, viaNapd string) (proxyFigures, error) {
	var f proxyFigures
	body := small(model)
	done := step("wake " + model)
	if err := post(ctx, client(), viaNapd, body); err != nil {
		return f, fmt.Errorf("wake %s: %w", model, err)
	}
	done()

	done = step(fmt.Sprintf("%s: latency, %d requests per path", model, o.requests))
	var err error
	if f.direct, f.viaNapd, err = measureLatency(ctx, direct, viaNapd, body, o.requests); err != nil {
		return f, fmt.Errorf("%s latency: %w", model, err)
	}
	done()

	done = step(fmt.Sprintf("%s: throughput, %d workers", model, o.workers))
	// Two alternating rounds per path; the better round of each counts,
	// so a burst from another process on the machine hurts neither.
	for range 2 {
		rps, err := measureThroughput(ctx, direct, body, o.workers, o.throughputFor)
		if err != nil {
			return f, fmt.Errorf("%s throughput: %w", model, err)
		}
		f.directRPS = max(f.directRPS, rps)
		cpu0 := n.cpu()
		start := time.Now()
		rps, err = measureThroughput(ctx, viaNapd, body, o.workers, o.throughputFor)
		if err != nil {
			return f, fmt.Errorf("%s throughput via napd: %w", model, err)
		}
		if rps > f.napdRPS {
			f.napdRPS = rps
			f.napdCPU = time.Duration(float64(n.cpu()-cpu0) / (rps * time.Since(start).Seconds()))
		}
	}
	done()
	return f, nil
}
