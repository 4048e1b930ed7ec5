package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// Targets from the gateway's specification.
const (
	targetAddedMedian = 150 * time.Microsecond
	targetAddedP99    = time.Millisecond
	targetThroughput  = 0.70
	targetChunk       = time.Millisecond
	targetRSS         = 200 << 20
	targetWake        = 50 * time.Millisecond
	targetSwapShare   = 50 * time.Millisecond
	// issue 17, measured with wrk against direct and nginx
	targetWrkAdded  = 100 * time.Microsecond
	targetWrkDirect = 0.45
	targetWrkNginx  = 0.7
)

// machine is what the figures were taken on.
type machine struct {
	cpu, kernel, goVersion, load string
	cores                        int
	date                         time.Time
}

func describeMachine() machine {
	m := machine{cpu: "unknown", cores: runtime.NumCPU(), goVersion: runtime.Version(), date: time.Now().UTC()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}

// proxyFigures are the proxy-cost figures against one engine.
type proxyFigures struct {
	engine             string
	direct, viaNapd    latency
	directRPS, napdRPS float64
	napdCPU            time.Duration // napd's CPU time per request at that throughput
}

// report is every figure of one run.
type report struct {
	machine                      machine
	proxy                        []proxyFigures
	chunkDirect, chunkNapd       latency
	chunks                       int
	workers                      int
	streamsWanted, streamsOpen   int
	rssIdle, rssStreams, rssPeak int64
	wakes                        []wakeFigure
	record                       recordFigures
	swaps                        []swapFigures
	swapClients, swapEach        int
	swapLoad                     string // load average when the swaps ran
	priorities                   []priorityFigures
	priorityLoad                 string // load average when the priority runs started
	wrk                          wrkFigures
	real                         realFigures
	allocs                       []goBench // BenchmarkProxy: direct, gateway
	scale                        scaleFigures
	warm                         *warmFigures
	progress                     []progressRound
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// markdown renders the figures file.
func (r *report) markdown() string {
	var b strings.Builder
	m := r.machine
	fmt.Fprintf(&b, `# napd gateway benchmark

Written by `+"`make bench`"+` (the program in `+"`bench/`"+`); rerun it to
measure your own machine. Everything runs on loopback on one host: the
client, napd, and the engine, which is the bench program itself in engine
mode — a minimal OpenAI-shaped server whose own cost is negligible, so the
figures are napd's. Each chunk of its streams carries its send time.
The real-engine table runs on llama.cpp's llama-server instead, when the
bench is given one.

Machine: %s, %d cores, Linux %s, %s, load average %s at the start,
%s.

`, m.cpu, m.cores, m.kernel, m.goVersion, m.load, m.date.Format("2006-01-02 15:04 UTC"))

	r.wrkMarkdown(&b)
	r.realMarkdown(&b)
	fmt.Fprintf(&b, `## Proxy cost with the bench's own Go client

| engine | | direct to the engine | through napd | added by napd | target | |
|---|---|---|---|---|---|---|
`)
	for _, p := range r.proxy {
		addedMed := p.viaNapd.median - p.direct.median
		addedP99 := p.viaNapd.p99 - p.direct.p99
		ratio := p.napdRPS / p.directRPS
		fmt.Fprintf(&b, "| %s | median latency | %s | %s | %s | < 150 µs | %s |\n", p.engine,
			us(p.direct.median), us(p.viaNapd.median), us(addedMed), met(addedMed < targetAddedMedian))
		fmt.Fprintf(&b, "| | p99 latency | %s | %s | %s | < 1 ms | %s |\n",
			us(p.direct.p99), us(p.viaNapd.p99), us(addedP99), met(addedP99 < targetAddedP99))
		fmt.Fprintf(&b, "| | throughput | %.0f req/s | %.0f req/s | %.0f %% of direct | ≥ 70 %% | %s |\n",
			p.directRPS, p.napdRPS, 100*ratio, met(ratio >= targetThroughput))
		fmt.Fprintf(&b, "| | napd CPU per request | | %s | | | |\n", us(p.napdCPU))
	}
	fmt.Fprintf(&b, `
Latency: requests one at a time, alternating between the two paths, after a
warm-up. Throughput: %d concurrent clients on keep-alive connections, the
better of two alternating rounds per path. Client, napd and engine share the
same cores, so through napd the machine does strictly more work per request:
the throughput ratio compares napd's CPU cost per request with the client's
and the engine's together. Both engines here answer in a few tens of
microseconds of CPU, less than napd, which like any HTTP proxy serves one
request and makes another, so with them the ratio stays far below 70 %%
however lean napd is. A real engine costs far more per request (vLLM's
Python API server is in the order of a millisecond of CPU): at napd's cost
per request above, that would put the ratio above 90 %% (an estimate from
these figures, not a measurement).

`, r.workers)

	fmt.Fprintf(&b, `## Streams

| | direct | through napd | target | |
|---|---|---|---|---|
| chunk delay, median | %s | %s | < 1 ms | %s |
| chunk delay, p99 | %s | %s | < 1 ms | %s |
| open streams at once | | %d of %d | 2,000 | %s |
| napd RSS with them open | | %s (idle: %s, peak: %s) | < 200 MiB | %s |

Chunk delay: from the engine's write of a chunk (its time stamp) to the
client's read of it, over %d chunks (streams of 50 chunks 2 ms apart, one
stream at a time). Through napd it includes both loopback hops, so it bounds
the time a chunk spends in napd from above; the target is checked on it.
RSS: napd's VmRSS (largest of five samples) while every stream is open and
has delivered its first chunk (one chunk a second each); peak is VmHWM.

`, us(r.chunkDirect.median), us(r.chunkNapd.median), met(r.chunkNapd.median < targetChunk),
		us(r.chunkDirect.p99), us(r.chunkNapd.p99), met(r.chunkNapd.p99 < targetChunk),
		r.streamsOpen, r.streamsWanted, met(r.streamsOpen >= 2000),
		mib(r.rssStreams), mib(r.rssIdle), mib(r.rssPeak), met(r.rssStreams > 0 && r.rssStreams < targetRSS),
		r.chunks)

	fmt.Fprintf(&b, `## Wake: how soon a waiting request is answered once the engine is healthy

| engine start-up | healthy after | answered after | answered after healthy | target ≤ 50 ms |
|---|---|---|---|---|
`)
	var slowest time.Duration
	for _, w := range r.wakes {
		after := w.replied - w.healthy
		slowest = max(slowest, after)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", w.delay, w.healthy.Round(time.Millisecond),
			w.replied.Round(time.Millisecond), after.Round(100*time.Microsecond), met(after <= targetWake))
	}
	fmt.Fprintf(&b, "\n| goal | figure | |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| wake overhead (engine healthy → answer) ≤ 50 ms, the slowest of %d wakes | %s | %s |\n",
		len(r.wakes), slowest.Round(100*time.Microsecond), met(len(r.wakes) > 0 && slowest <= targetWake))
	fmt.Fprintf(&b, `
Each row is one request to a sleeping model (sleep = "stop") whose engine
answers /health with 503 for its start-up time and then 200; the engine
writes that moment down, and the reply's arrival at the client is compared
with it. The model is put to sleep again between rows.

`)
	r.scaleMarkdown(&b)
	r.recordingMarkdown(&b)
	r.swapMarkdown(&b)
	r.priorityMarkdown(&b)
	if r.warm != nil {
		r.warm.markdown(&b)
	}
	r.progressMarkdown(&b)
	return strings.TrimRight(b.String(), "\n") + "\n"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// swapMarkdown renders the swap workload's figures.
func (r *report) swapMarkdown(b *strings.Builder) {
	if len(r.swaps) == 0 {
		return
	}
	fmt.Fprintf(b, `
## Swaps: two models that do not fit together

| policy | requests | failed | requests/s | swaps | p50 latency | p99 latency |
|---|---|---|---|---|---|---|
`)
	for _, f := range r.swaps {
		fmt.Fprintf(b, "| %s | %d | %d | %.1f | %d | %s | %s |\n", f.policy, f.requests, f.failed,
			float64(f.requests-f.failed)/f.elapsed.Seconds(), f.swaps, ms(f.lat.median), ms(f.lat.p99))
	}
	for _, f := range r.swaps {
		if f.firstErr != nil {
			fmt.Fprintf(b, "\n%s: the first failure: %v\n", f.policy, f.firstErr)
		}
	}
	napd := r.swaps[0]
	fmt.Fprintf(b, `
napd's share of a swap, from the holder's last answered byte to the waiting
model's engine start: median %s, p99 %s (target < 50 ms: %s). Of that, from
the holder's engine exit to the start: median %s, p99 %s.

Two 16 GiB models on a 24 GiB GPU (the fake nvidia-smi of tests/planner,
which reports the memory of the napd-demo-engine processes napd runs), %d
clients each sending %d small chat requests for a random one of the two
(same seed in both runs), load average %s when they started. The naive policy is the bench itself putting the
loaded model to sleep (napctl sleep) before every request for the other one,
one request at a time in arrival order, as a proxy that swaps per request
does. napd's figures include its GPU measurement before each wake
(nvidia-smi), which a real driver answers in tens of milliseconds.
`, ms(napd.napdShare.median), ms(napd.napdShare.p99), met(napd.napdShare.median < targetSwapShare),
		ms(napd.stopGap.median), ms(napd.stopGap.p99), r.swapClients, r.swapEach, r.swapLoad)
}
