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

// whereTimeGoes is what the profiles of issue 17 showed; it does not
// change from run to run, so it is written as it was found, on the tree
// it was found on.
const whereTimeGoes = `### Where napd's time went, with its own HTTP/1.1 stack (issue 17)

These findings are of napd as it was when they were made (up to c16f7c7),
when its gateway served clients and forwarded to engines through its own
HTTP/1.1 code (` + "`internal/h1`" + `). Issue 30 replaces that with
net/http's server, ` + "`http.Transport`" + ` and ` + "`httputil.ReverseProxy`" + `:
what is said below of ` + "`internal/h1`" + ` describes that older tree, and the
wrk tables above, with -napd-b, compare the two. What the Go floor and
the engine column showed holds for any proxy.

Profiles of napd under wrk (Go CPU profiles and ` + "`perf record -g`" + ` with
kernel stacks at -c32 and -c1, ` + "`strace -c -f -p PID`" + `, thread switch
counts) on the 2-core machine above, beside the Go floor:

- The Go floor row is what Go itself costs here: the same two reads and
  two writes per request as napd, on Go's netpoller and scheduler, with
  napd's CPU count. It comes close to nginx in throughput, CPU per
  request and added latency. So neither the Go runtime's scheduler and
  netpoller nor what the kernel and this virtual machine's hypervisor
  charge for loopback writes and wakeups holds napd back from nginx's
  figures: the floor pays them too.
- One runtime cost napd does not pay: net.Conn's reads and writes enter
  each system call through the runtime's entersyscall, which wakes its
  monitor thread (sysmon) whenever it slept because the process was
  idle, and at one connection a proxy goes idle twice per request. The
  floor's threads switch about four times per request at -c1, two of
  them that thread's. napd reads and writes its sockets with raw system
  calls (` + "`internal/h1`" + `'s sockIO: the sockets are non-blocking, so the
  calls return at once, and Go's netpoller still does the waiting): two
  switches per request, and about a third less CPU per request at -c1.
- napd's system calls per request are the floor's plus one: two writes,
  two reads that return data, one or two that find none yet and park
  the goroutine, and a non-blocking peek (recvfrom) on a reused engine
  connection. The peek tells a connection the engine closed while idle
  from a live one before a request is written on it; net/http's
  Transport learns the same from a read it keeps running on every idle
  connection. It is about 3 % of napd's CPU. With raw socket I/O napd's
  system time per request is below the floor's (the user + system
  column); its user time is about twice the floor's and nginx's.
- So the difference is napd's own work in user space, and it is spread
  thin: no function takes more than about 3 % of napd's CPU. The
  shares: allocation and garbage collection about a tenth, and most of
  it the collections: at the runtime's least goal (4 MiB: napd's live
  heap is a megabyte, it allocates ~5 KiB per request) napd collected
  ~25 times a second, each scanning every goroutine's stack; with a
  32 MiB goal (GOGC=800), three times a second, and 2.4 µs less user
  time per request (five interleaved rounds, every one lower): a heap
  floor (agent.heap_floor, since deprecated and ignored: it paid only
  here) kept that goal while the heap grew fast. The floor with 30 extra allocations of 96 bytes per
  request spends ~2 µs more per request and loses 2-5 % of its
  throughput; the
  request's and the answer's heads (the request's header map, net/http's
  type, which the gateway's features are written against); admission and the
  lease (the model's lock, a lease record); metrics; the body's routing
  fields and the answer's usage counts; contexts, deadlines and clock
  readings (25-50 ns each on this machine). At one connection each
  costs about twice as much as at 32: between two requests wrk and the
  engine run on napd's CPU, and napd comes back to cold caches.
- That work costs napd more throughput than its own CPU time says: the
  engine column. Behind napd the engine spends more CPU per request than
  behind the floor or nginx (48, 37 and 32 µs in one interleaved
  measurement): ` + "`perf stat`" + ` on the engine counts, per request, 0.74, 0.34
  and 0.23 epoll waits, 0.49, 0.23 and 0.11 futex calls, 0.95, 0.65 and
  0.33 thread switches. napd's requests reach the engine spaced by
  napd's per-request work on its one thread; between two, the engine's
  threads run out of work, sleep, and are woken again. The floor made
  to spin 6 or 12 µs per request before it forwards (its user time then
  about napd's) fell to napd's throughput, and its engine's CPU per
  request rose to napd's engine's (two interleaved rounds: 14.9k and
  15.5k req/s against napd's 15.1k, then 12.6k and 11.9k against 11.9k;
  engine 46-61 µs against napd's engine's 46-58, 39-41 behind the plain
  floor): napd's own user time is the whole of the gap, and each
  microsecond of it costs about 2-3 % of the throughput at 32
  connections. The engine's
  threading matters as much ("The same with a one-thread engine" above):
  with the engine on one thread, as the single event loop of vLLM's and
  SGLang's API servers, napd measured 0.43-0.44× direct and 0.73-0.74×
  nginx in rounds interleaved with the two-thread engine's 0.39× and
  0.62×: napd's own throughput rose by 11-15 %, direct's and nginx's
  moved by a few percent either way.
- What napd does about it. Its own HTTP/1.1 server and engine client
  (` + "`internal/h1`" + `, docs/gateway.md): a request is read, handled,
  forwarded and answered on its connection's goroutine, with none of
  net/http's goroutine hand-offs per request; a head is copied into one
  string, and a request's URL, body, writer and header values are made
  together. Its own forwarding (the gateway's ` + "`send`" + `), without
  httputil.ReverseProxy's copies of the request and of every header
  value. A request's admission and end run on its own goroutine under
  its model's lock (docs/design.md), not through the model's loop. The
  gateway adds about 21 allocations per request (TestProxyAllocs): a
  request's call holds its recorder, engine request and body reader; the
  engine's request takes over the client's header map, edited; its
  deadline arms a timer only when something waits on it; the engine
  client watches requests for cancellation with a sweep every 10 ms
  rather than a registration each; the engine's answer's fields are
  read into a list, edited there and written out in the order they came
  (h1.Head: no header map is made, looked up or walked; 0.4 µs less
  reading an answer's head, BenchmarkReadAnswer); a request's context ends with
  the server's through one registration per connection. The default
  engine path rules are matched by a map lookup and, for the few with
  wildcards, only on a path that holds their longest literal run.
  Socket deadlines move only when a read or write would reach them.
  Durations read the monotonic clock alone.
- napd ran its Go code on half the CPUs it may use, two at least
  (agent.cpus, since deprecated and ignored: Go's own GOMAXPROCS, two
  here, is the same on this 2-CPU machine). With one, each
  request's forwarding waits for every other request's work on that
  thread, and the engine gets its requests further apart: in twelve
  interleaved rounds at -c32, two threads gave 5-10 % more throughput
  than one in every round (napd's own CPU per request a tenth to a
  fifth higher, the engine's lower), with the same median at one
  connection (six rounds each: 194 and 195.5 µs). Without the heap
  floor, two threads were ~10 µs slower at one connection (five rounds:
  203 against 194 µs), as they had been by more in earlier versions:
  the two go together.

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
