package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The wrk comparison: what users measure a proxy with. Three paths to the
// same engine, each measured by wrk in interleaved rounds: straight to the
// engine, through nginx (a keep-alive upstream: the reference for "a good
// proxy"), and through napd.

// Five rounds: on this shared machine a path's throughput moves by 10-15 %
// from one minute to the next, and the median of three moved the ratios
// by a few hundredths from run to run.
const (
	wrkRounds     = 5
	wrkDuration   = 3 * time.Second
	wrkConcurrent = 32
)

// wrkPath is one of the compared paths.
type wrkPath struct {
	name string
	url  string
	// cpu, when set, is the CPU time the proxy of this path used so far;
	// switches, its threads' context switches so far; engine, the CPU time
	// its engine used so far.
	cpu      func() cpuTimes
	switches func() int64
	engine   func() time.Duration
}

// wrkResult is one wrk run's figures.
type wrkResult struct {
	rps       float64
	median    time.Duration
	requests  int64
	cpuPer    cpuTimes      // the proxy's CPU per request (zero = not measured)
	switches  float64       // the proxy's context switches per request
	enginePer time.Duration // the engine's CPU per request (0 = not measured)
}

// wrkFigures are the median round of each path at 1 and conns connections.
type wrkFigures struct {
	paths   []string
	conns   int                  // the connections of many
	one     map[string]wrkResult // at 1 connection
	many    map[string]wrkResult // at conns connections
	nginx   string               // why nginx is missing ("" = measured)
	load    string               // load average when the comparison started
	skipped string               // why the whole comparison is missing
	// oneThread is the comparison with the engine on one thread.
	oneThread *wrkFigures
}

// wrkCompare runs the comparison on paths (direct first) at 1 and conns
// connections.
func wrkCompare(ctx context.Context, bodyFile string, paths []wrkPath, conns int) (wrkFigures, error) {
	f := wrkFigures{conns: conns, one: map[string]wrkResult{}, many: map[string]wrkResult{}, load: describeMachine().load}
	rounds := map[string][]wrkResult{}
	for _, p := range paths {
		f.paths = append(f.paths, p.name)
		// Warm-up: connections, caches, and the model's first answer.
		if _, err := runWrk(ctx, p.url, bodyFile, conns, time.Second); err != nil {
			return f, fmt.Errorf("wrk warm-up %s: %w", p.name, err)
		}
	}
	for range wrkRounds {
		for _, c := range []int{1, conns} {
			for _, p := range paths {
				var cpu0 cpuTimes
				var sw0 int64
				var eng0 time.Duration
				if p.cpu != nil {
					cpu0, sw0 = p.cpu(), p.switches()
				}
				if p.engine != nil {
					eng0 = p.engine()
				}
				r, err := runWrk(ctx, p.url, bodyFile, c, wrkDuration)
				if err != nil {
					return f, fmt.Errorf("wrk %s -c%d: %w", p.name, c, err)
				}
				if n := time.Duration(r.requests); n > 0 {
					if p.cpu != nil {
						d := p.cpu().sub(cpu0)
						r.cpuPer = cpuTimes{d.user / n, d.sys / n}
						r.switches = float64(p.switches()-sw0) / float64(r.requests)
					}
					if p.engine != nil {
						r.enginePer = (p.engine() - eng0) / n
					}
				}
				key := fmt.Sprintf("%s/%d", p.name, c)
				rounds[key] = append(rounds[key], r)
			}
		}
	}
	for _, p := range paths {
		f.one[p.name] = medianRound(rounds[p.name+"/1"])
		f.many[p.name] = medianRound(rounds[fmt.Sprintf("%s/%d", p.name, conns)])
	}
	return f, nil
}

// medianRound is the round with the median throughput, its median latency
// replaced by the median of the rounds' medians.
func medianRound(rs []wrkResult) wrkResult {
	byRPS := slices.Clone(rs)
	slices.SortFunc(byRPS, func(a, b wrkResult) int { return int(a.rps - b.rps) })
	m := byRPS[len(byRPS)/2]
	meds := make([]time.Duration, len(rs))
	for i, r := range rs {
		meds[i] = r.median
	}
	slices.Sort(meds)
	m.median = meds[len(meds)/2]
	return m
}

// wrkScript makes wrk post the body in bodyFile as JSON.
const wrkScript = `local f = io.open(os.getenv("BENCH_BODY"), "r")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
`

// runWrk runs wrk on url with conns connections for dur.
func runWrk(ctx context.Context, url, bodyFile string, conns int, dur time.Duration) (wrkResult, error) {
	script := filepath.Join(filepath.Dir(bodyFile), "post.lua")
	if err := os.WriteFile(script, []byte(wrkScript), 0o644); err != nil {
		return wrkResult{}, err
	}
	threads := min(conns, 2)
	cmd := exec.CommandContext(ctx, "wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", fmt.Sprintf("%.0fs", dur.Seconds()), "--latency", "-s", script, url)
	cmd.Env = append(os.Environ(), "BENCH_BODY="+bodyFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("%w: %s", err, out)
	}
	return parseWrk(string(out))
}

// parseWrk reads the figures of wrk --latency's report.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	var haveMedian bool
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "50%":
			d, err := parseWrkDuration(f[1])
			if err != nil {
				return r, err
			}
			r.median, haveMedian = d, true
		case len(f) == 2 && f[0] == "Requests/sec:":
			r.rps, _ = strconv.ParseFloat(f[1], 64)
		case len(f) >= 3 && f[1] == "requests" && f[2] == "in":
			r.requests, _ = strconv.ParseInt(f[0], 10, 64)
		case len(f) >= 2 && f[0] == "Non-2xx":
			return r, fmt.Errorf("wrk saw failed requests:\n%s", out)
		}
	}
	if !haveMedian || r.rps == 0 {
		return r, fmt.Errorf("no figures in wrk's report:\n%s", out)
	}
	return r, nil
}

// parseWrkDuration reads wrk's "77.00us", "1.20ms" or "2.00s".
func parseWrkDuration(s string) (time.Duration, error) {
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("wrk latency %q: %w", s, err)
			}
			return time.Duration(x * float64(u.unit)), nil
		}
	}
	return 0, fmt.Errorf("wrk latency %q: unknown unit", s)
}

// nginx is the reference proxy, run from its Debian binary on a config of
// its own in dir.
type nginx struct {
	cmd  *exec.Cmd
	addr string
}

// startNginx proxies a free port to the engine on enginePort with a
// keep-alive upstream, as a tuned nginx in front of an engine would.
func startNginx(dir string, enginePort int) (*nginx, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	conf := filepath.Join(dir, "nginx.conf")
	cfg := fmt.Sprintf(`worker_processes auto;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 16384; }
http {
	access_log off;
	client_body_temp_path %[1]s/nginx-body;
	proxy_temp_path %[1]s/nginx-proxy;
	upstream engine {
		server 127.0.0.1:%[2]d;
		keepalive 256;
	}
	server {
		listen %[3]s;
		location / {
			proxy_pass http://engine;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
		}
	}
}
`, dir, enginePort, addr)
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	n := &nginx{addr: addr, cmd: exec.Command(bin, "-p", dir, "-c", conf)}
	var log strings.Builder
	n.cmd.Stdout, n.cmd.Stderr = &log, &log
	if err := n.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/health"); err == nil {
			resp.Body.Close()
			return n, nil
		}
	}
	n.stop()
	return nil, fmt.Errorf("nginx did not answer on %s: %s", addr, log.String())
}

func (n *nginx) stop() {
	_ = n.cmd.Process.Signal(os.Interrupt) // SIGINT: nginx's fast shutdown
	_ = n.cmd.Wait()
}

// oneThreadMarkdown renders the comparison with the one-thread engine.
func (f *wrkFigures) oneThreadMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "### The same with a one-thread engine\n\n")
	f.table(b)
	napd, directRPS := f.many["napd"], f.many["direct"].rps
	fmt.Fprintf(b, "\nnapd: %.2f × direct", napd.rps/directRPS)
	if ng, ok := f.many["nginx"]; ok {
		fmt.Fprintf(b, ", %.2f × nginx", napd.rps/ng.rps)
	}
	fmt.Fprintf(b, ", +%s at one connection.\n", us(f.one["napd"].median-f.one["direct"].median))
	b.WriteString(`
The same engine with its Go code on one thread (GOMAXPROCS=1, the "proxy1"
model), measured the same way right after the table above: the HTTP front
of vLLM and SGLang is one Python event loop, so this is the closer
likeness of the engines napd serves. The goals above stay measured on the
two-thread engine they were set on.

`)
}

// table writes the paths' figures as a table.
func (f *wrkFigures) table(b *strings.Builder) {
	fmt.Fprintf(b, `| path | req/s at %d connections | × direct | median at 1 connection | added median | proxy CPU per request (at %d): user + system | proxy thread switches per request | engine CPU per request |
|---|---|---|---|---|---|---|---|
`, f.conns, f.conns)
	direct := f.one["direct"].median
	directRPS := f.many["direct"].rps
	for _, p := range f.paths {
		one, many := f.one[p], f.many[p]
		added, cpu, sw, eng := "—", "", "", ""
		if p != "direct" {
			added = signed(one.median - direct)
		}
		if c := many.cpuPer; c.total() > 0 {
			cpu = fmt.Sprintf("%s: %s + %s", us(c.total()), us(c.user), us(c.sys))
			sw = fmt.Sprintf("%.1f", many.switches)
		}
		if many.enginePer > 0 {
			eng = us(many.enginePer)
		}
		fmt.Fprintf(b, "| %s | %.0f | %.2f | %s | %s | %s | %s | %s |\n", p, many.rps, many.rps/directRPS, us(one.median), added, cpu, sw, eng)
	}
}

// wrkMarkdown renders the comparison.
func (r *report) wrkMarkdown(b *strings.Builder) {
	f := r.wrk
	fmt.Fprintf(b, "## Proxy cost measured with wrk: direct, nginx, the stock Go proxy, the Go floor, napd\n\n")
	if f.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s. `scripts/bench-deps.sh` installs wrk and nginx-light.\n\n", f.skipped)
		return
	}
	f.table(b)
	direct := f.one["direct"].median
	directRPS := f.many["direct"].rps
	napdOne, napdMany := f.one["napd"], f.many["napd"]
	addedNapd := napdOne.median - direct
	fmt.Fprintf(b, "\n| goal | figure | |\n|---|---|---|\n")
	fmt.Fprintf(b, "| added median at 1 connection ≤ 100 µs | %s | %s |\n", us(addedNapd), met(addedNapd <= targetWrkAdded))
	if gp, ok := f.one[goReverseProxy]; ok {
		addedGo := gp.median - direct
		fmt.Fprintf(b, "| added median at 1 connection ≤ the stock Go proxy's (%s) | %s | %s |\n", us(addedGo), us(addedNapd), met(addedNapd <= addedGo))
	}
	fmt.Fprintf(b, "| throughput at %d connections ≥ 0.45 × direct | %.2f × direct | %s |\n", f.conns,
		napdMany.rps/directRPS, met(napdMany.rps >= targetWrkDirect*directRPS))
	if ng, ok := f.many["nginx"]; ok {
		fmt.Fprintf(b, "| throughput at %d connections ≥ 0.7 × nginx | %.2f × nginx | %s |\n", f.conns,
			napdMany.rps/ng.rps, met(napdMany.rps >= targetWrkNginx*ng.rps))
	} else {
		fmt.Fprintf(b, "| throughput ≥ 0.7 × nginx | not measured: %s | |\n", f.nginx)
	}
	fmt.Fprintf(b, `
wrk %d times %s per path and connection count, the paths interleaved (direct,
nginx, napd, direct, …) so a burst from elsewhere on the machine hits all of
them alike; each figure is the median round. wrk posts the small chat body
of the table below ("max_tokens":4) to the minimal engine, with 1 thread at
1 connection and 2 threads at %d. nginx (Debian's nginx-light, worker_processes
auto) proxies to the same engine through an upstream with keepalive 256 and
HTTP/1.1, as a tuned nginx would. Go ReverseProxy is the stock Go proxy
(this program with -goproxy): net/http's server, httputil.ReverseProxy and
net/http's Transport with keep-alive, nothing else. Go floor is the least
a Go program can do to forward these requests (this program with -floor):
one goroutine per client connection with an engine connection of its own,
heads passed on unread, bodies by Content-Length, its Go code on as many
CPUs as napd's; no routing, limits, headers or errors. It pays what the Go
runtime and the kernel cost for the two reads and two writes napd makes
per request too: what napd costs beyond it is napd's own work. napd runs with its config's defaults and Go's own
GOMAXPROCS (the CPUs it may use: two here). Proxy CPU per request: the proxy's user and
system time from /proc/PID/stat over the run, divided by the requests wrk
completed (10 ms ticks: over a %s run of thousands of requests, well
resolved), their sum first. Engine CPU per request: the engine's, measured
alike over the same run (for direct, the only process between wrk and
itself). Thread switches: the voluntary and involuntary context switches
of all the proxy's threads (/proc/PID/task/*/status; nginx: its workers),
per request: each is a thread put to sleep or preempted and woken again. Load average when this section started: %s.
%s
`, wrkRounds, wrkDuration, f.conns, wrkDuration, f.load, f.abNote())
	if o := f.oneThread; o != nil && len(o.paths) > 0 {
		o.oneThreadMarkdown(b)
	}
	r.allocsMarkdown(b)
	b.WriteString(whereTimeGoes)
}

// whereTimeGoes is what profiles of napd under wrk showed (issues 17 and
// 30); it does not change from run to run, so it is written as found.
const whereTimeGoes = `### Where napd's time goes

Profiles of napd under wrk on the 2-core machine (` + "`perf record -g`" + `,
` + "`strace -c -f`" + `, thread switch counts), on the bench engine and on
llama-server:

- The Go floor row is what Go itself costs here: the same two reads and
  two writes per request as any proxy, on Go's netpoller and scheduler.
  It comes close to nginx, so neither the Go runtime nor what the kernel
  and this virtual machine charge for loopback holds a Go proxy back.
- napd is served by net/http's server and reaches engines through
  ` + "`http.Transport`" + `, forwarding with ` + "`httputil.ReverseProxy`" + `
  (docs/gateway.md): the stack the stock Go proxy row runs, and napd's
  figures sit near that row's. What the stack costs beyond the floor is
  its goroutine hand-offs: the server reads ahead on a goroutine of its
  own while a handler runs, and the Transport writes each request and
  reads each answer on two goroutines per connection, which hand the
  request and the answer to the handler's goroutine over channels. At
  low concurrency each hand-off wakes a sleeping thread (the switch
  column behind llama-server at 4 connections: the stock Go proxy's 7-9
  per request and napd's 12-16, the floor's 4-5, nginx's 2).
- Until issue 30 napd ran its own HTTP/1.1 server and engine client
  (` + "`internal/h1`" + `, up to c16f7c7): each request read, forwarded and
  answered on its connection's goroutine, with raw system calls. On the
  bench engine, whose answer costs microseconds, that bought 30-100 µs
  per request; on llama-server the whole stack measured 9-15 % more
  throughput at 4 connections than this tree in two interleaved runs
  (and 0.2-0.4 ms of median), and a synchronous engine client on
  net/http's own request writer and answer parser in place of the
  Transport, on this tree, 1 % at 4 connections and 6 % at one (one
  interleaved run; CPU per request 245 against 300 µs). Under the 5 %
  at 4 connections that would have kept a client of napd's own: napd
  keeps the one stack the Go team maintains, and pays about 0.3 ms on a
  request of one token, nothing a streamed completion shows.
- Two costs that were napd's own and went: a negative
  ` + "`FlushInterval`" + ` on ReverseProxy flushed every answer's head at once
  from a timer's goroutine (` + "`time.AfterFunc(-1)`" + `), a write and thread
  switches per request of their own; napd now lets ReverseProxy flush
  event streams and answers of unknown length at each write and sends an
  answer of known length in one write. And under the exec supervisor
  napd copied an engine's output to its log as each line came:
  llama-server writes about ten lines per request, and napd read and
  wrote ~10 and ~7 times per request for it (~100 µs of napd's CPU per
  request); it now copies in batches at most 50 ms apart (~5 and ~3,
  ` + "`strace -c -f`" + ` at one connection). Under systemd the journal reads
  an engine's output, not napd.
- Left to Go: GOMAXPROCS (Go sizes it from the CPUs napd may use, its
  cgroup's quota counted; on llama-server GOMAXPROCS=1 measured no better
  than Go's two, interleaved: 0.69 against 0.71 × direct at one
  connection, 0.91 against 0.98 at four) and GOGC. The heap floor and
  agent.cpus of issue 17 paid only on the bench engine and are gone
  (their keys are accepted with a warning for one release).
- What stays of issue 17's work, because it is napd's own and costs
  nothing to keep: a request's admission and end run on its own goroutine
  under its model's lock (docs/design.md), not through the model's loop;
  the body's routing fields and the answer's usage counts are read
  without encoding/json's reflection; metrics' series are looked up once
  per request. The allocation table above bounds the rest.

`

// wrkTarget is an engine the wrk comparison runs on.
type wrkTarget struct {
	model     string // its napd model
	path      string // the request path
	body      string // the request body
	conns     int    // the connections of the second count (the first is 1)
	goProxies bool   // the stock Go proxy and the Go floor too
}

// wrkSection runs the comparison against the "proxy" model's engine:
// direct, through nginx when it is installed, the Go proxies and napd
// (and napd B when b is set); then direct, nginx and the napds again to
// "proxy1", the same engine on one thread.
func wrkSection(ctx context.Context, a, b *napd) (wrkFigures, error) {
	if _, err := exec.LookPath("wrk"); err != nil {
		return wrkFigures{skipped: "wrk is not installed"}, nil
	}
	t := wrkTarget{model: "proxy", path: chatPath, body: small("proxy"), conns: wrkConcurrent, goProxies: true}
	f, err := wrkEngine(ctx, a, b, t)
	if err != nil {
		return f, err
	}
	t = wrkTarget{model: "proxy1", path: chatPath, body: small("proxy1"), conns: wrkConcurrent}
	one, err := wrkEngine(ctx, a, b, t)
	f.oneThread = &one
	return f, err
}

// chatPath is the path of the bench engine's requests.
const chatPath = "/v1/chat/completions"

// goReverseProxy names the stock Go proxy's row.
const goReverseProxy = "Go ReverseProxy"

// goProxyStart names a Go proxy of the comparison and starts it.
type goProxyStart struct {
	name  string
	start func(enginePort int) (*goProxy, error)
}

// wrkEngine compares the paths to t's engine, napd a's: direct, nginx,
// the Go proxies when t asks for them, napd a, and napd b (its own copy of
// the engine) when b is set.
func wrkEngine(ctx context.Context, a, b *napd, t wrkTarget) (wrkFigures, error) {
	napds := []*napd{a}
	if b != nil {
		napds = append(napds, b)
	}
	for _, n := range napds { // wakes the engines
		if err := post(ctx, client(), "http://"+n.addr+t.path, t.body); err != nil {
			return wrkFigures{}, fmt.Errorf("wake %s through %s: %w", t.model, n.name, err)
		}
	}
	dir := filepath.Join(a.dir, t.model)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return wrkFigures{}, err
	}
	body := filepath.Join(dir, "body.json")
	if err := os.WriteFile(body, []byte(t.body), 0o644); err != nil {
		return wrkFigures{}, err
	}
	enginePort := a.engines[t.model]
	engine := a.engineCPU(t.model)
	paths := []wrkPath{{name: "direct", url: fmt.Sprintf("http://127.0.0.1:%d%s", enginePort, t.path), engine: engine}}
	why := ""
	if ng, err := startNginx(dir, enginePort); err != nil {
		why = err.Error()
	} else {
		defer ng.stop()
		pid := ng.cmd.Process.Pid
		paths = append(paths, wrkPath{name: "nginx", url: "http://" + ng.addr + t.path, engine: engine,
			cpu: func() cpuTimes { return treeTimes(pid) }, switches: func() int64 { return treeSwitches(pid) }})
	}
	var starts []goProxyStart
	if t.goProxies {
		starts = []goProxyStart{{goReverseProxy, startGoProxy}, {"Go floor", startFloor}}
	}
	for _, gp := range starts {
		p, err := gp.start(enginePort)
		if err != nil {
			return wrkFigures{}, err
		}
		defer p.stop()
		pid := p.cmd.Process.Pid
		paths = append(paths, wrkPath{name: gp.name, url: "http://" + p.addr + t.path, engine: engine,
			cpu: func() cpuTimes { return treeTimes(pid) }, switches: func() int64 { return procSwitches(pid) }})
	}
	for _, n := range napds {
		pid := n.cmd.Process.Pid
		paths = append(paths, wrkPath{name: n.name, url: "http://" + n.addr + t.path, engine: n.engineCPU(t.model),
			cpu: func() cpuTimes { return procTimes(pid) }, switches: func() int64 { return procSwitches(pid) }})
	}
	f, err := wrkCompare(ctx, body, paths, t.conns)
	f.nginx = why
	return f, err
}
