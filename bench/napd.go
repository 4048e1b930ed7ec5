package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/napd/napd/agent/control"
)

// wakeDelays are the engine start-up times the wake figure is taken at:
// short, and long enough for napd's health polling to have slowed down.
var wakeDelays = []time.Duration{300 * time.Millisecond, time.Second, 2 * time.Second}

// napd is a napd process under test and the engines it supervises.
type napd struct {
	name    string // its row in the wrk tables
	dir     string
	addr    string         // gateway host:port
	engines map[string]int // engine port by model, for direct requests
	socket  string
	cmd     *exec.Cmd
	log     bytes.Buffer
	exited  chan struct{}
}

// newNapd makes the directory (its name starting with prefix) of a napd
// yet to be launched, named name in the wrk tables, and reserves its
// gateway's port.
func newNapd(name, prefix string) (*napd, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &napd{name: name, dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), engines: map[string]int{},
		socket: filepath.Join(dir, "control.sock"), exited: make(chan struct{})}, nil
}

// engineModel is one [models.NAME] table of a bench napd's config.
type engineModel struct {
	name        string
	command     []string // ${PORT} stands for the engine's port
	direct      bool     // the bench sends requests to the engine itself: it picks the port
	port        int      // 0: napd picks one
	concurrency int      // max_concurrency; 0: napd's default
	queue       int      // 0: napd's default
}

// table is the model's config table.
func (m engineModel) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n[models.%q]\ncommand = [", m.name)
	for i, a := range m.command {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", a)
	}
	b.WriteString("]\nhealth = \"/health\"\nsleep = \"stop\"\n")
	if m.port != 0 {
		fmt.Fprintf(&b, "port = %d\n", m.port)
	}
	if m.concurrency > 0 {
		fmt.Fprintf(&b, "max_concurrency = %d\n", m.concurrency)
	}
	if m.queue > 0 {
		fmt.Fprintf(&b, "queue = %d\n", m.queue)
	}
	return b.String()
}

// benchPolicy keeps every woken model awake and gives a wake 30 s.
const benchPolicy = `
[policy]
idle_timeout = "0"
wake_timeout = "30s"
`

// wakeModel names the model whose engine starts in d.
func wakeModel(d time.Duration) string { return "wake-" + d.String() }

// readyFile is where the wake model's engine writes when it turns healthy.
func (n *napd) readyFile(d time.Duration) string {
	return filepath.Join(n.dir, wakeModel(d)+".ready")
}

// wrkModels are the models the wrk comparisons run on: "proxy" (the
// bench engine, self), "proxy1" (the same on one thread) and, with real
// set, "llama" (llama-server).
func wrkModels(self string, real *realEngine) []engineModel {
	ms := []engineModel{
		{name: "proxy", command: []string{self, "-engine", "-port", "${PORT}"}, direct: true, concurrency: 16384, queue: 4096},
		{name: "proxy1", command: []string{self, "-engine", "-port", "${PORT}", "-procs", "1"}, direct: true, concurrency: 16384, queue: 4096},
	}
	if real != nil {
		ms = append(ms, engineModel{name: realModel, command: real.command(), direct: true})
	}
	return ms
}

// startNapd starts napd from binDir on its models (mainModels). self is
// this program, run by napd as the engine.
func startNapd(binDir, self string, real *realEngine) (*napd, error) {
	n, err := newNapd("napd", "napd-bench-")
	if err != nil {
		return nil, err
	}
	if err := n.start(binDir, n.mainModels(binDir, self, real)); err != nil {
		return nil, err
	}
	return n, nil
}

// mainModels are the models of the bench's napd: the wrk models
// (wrkModels), "demo" (napd-demo-engine answering at once) and one
// "wake-D" model per wake delay.
func (n *napd) mainModels(binDir, self string, real *realEngine) []engineModel {
	ms := append(wrkModels(self, real), engineModel{name: "demo", direct: true, concurrency: 4096, queue: 4096,
		command: []string{filepath.Join(binDir, "napd-demo-engine"), "--host", "127.0.0.1", "--port", "${PORT}",
			"--model", "demo", "--ttft", "0", "--tokens-per-second", "0"}})
	for _, d := range wakeDelays {
		ms = append(ms, engineModel{name: wakeModel(d),
			command: []string{self, "-engine", "-port", "${PORT}", "-startup-delay", d.String(), "-ready-file", n.readyFile(d)}})
	}
	return ms
}

// napdB names the second napd of the A/B comparison.
const napdB = "napd (B)"

// startNapdB starts the napd of the A/B comparison from binDir with the
// wrk models alone, on engines of its own: napd refuses an engine port
// another process listens on, so the two cannot share one engine.
func startNapdB(binDir, self string, real *realEngine) (*napd, error) {
	n, err := newNapd(napdB, "napd-bench-b-")
	if err != nil {
		return nil, err
	}
	if err := n.start(binDir, wrkModels(self, real)); err != nil {
		return nil, err
	}
	return n, nil
}

// start launches napd from binDir on a config with models (configure).
func (n *napd) start(binDir string, models []engineModel) error {
	cfg, err := n.configure(models)
	if err != nil {
		os.RemoveAll(n.dir)
		return err
	}
	return n.launch(binDir, cfg, nil)
}

// configure gives the direct models free ports (n.engines) and returns
// the config file with models.
func (n *napd) configure(models []engineModel) (string, error) {
	k := 0
	for _, m := range models {
		if m.direct {
			k++
		}
	}
	ports, err := freePorts(k)
	if err != nil {
		return "", err
	}
	for i := range models {
		if models[i].direct {
			models[i].port, ports = ports[0], ports[1:]
			n.engines[models[i].name] = models[i].port
		}
	}
	return n.config(models), nil
}

// config is a bench napd's config file with models.
func (n *napd) config(models []engineModel) string {
	var cfg strings.Builder
	cfg.WriteString(n.baseConfig("5m"))
	cfg.WriteString(benchPolicy)
	for _, m := range models {
		cfg.WriteString(m.table())
	}
	return cfg.String()
}

// baseConfig is the [agent] and [gateway] tables of a bench napd in n.dir:
// exec supervisor, no metrics, the gateway on n.addr.
func (n *napd) baseConfig(requestTimeout string) string {
	return fmt.Sprintf(`[agent]
supervisor = "exec"
state_dir = %q
control_socket = %q
metrics_listen = ""
log_level = "info"

[gateway]
listen = [%q]
request_timeout = %q
max_connections = 16384
`, filepath.Join(n.dir, "state"), n.socket, n.addr, requestTimeout)
}

// launch writes cfg into n.dir and runs napd from binDir on it, with env
// added to its environment, until its gateway answers /health.
func (n *napd) launch(binDir, cfg string, env []string) error {
	path := filepath.Join(n.dir, "napd.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	n.cmd = exec.Command(filepath.Join(binDir, "napd"), "--config", path)
	n.cmd.Env = append(os.Environ(), env...)
	n.cmd.Stdout, n.cmd.Stderr = &n.log, &n.log
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("start napd: %w", err)
	}
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	if err := n.waitHealthy(15 * time.Second); err != nil {
		n.stop()
		return err
	}
	return nil
}

func (n *napd) waitHealthy(within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-n.exited:
			return fmt.Errorf("napd exited:\n%s", n.log.String())
		default:
		}
		if resp, err := http.Get("http://" + n.addr + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("napd not healthy within %s", within)
}

// stop ends napd (which stops its engines) and removes its directory.
func (n *napd) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
	os.RemoveAll(n.dir)
}

// sleepModel puts a model to sleep through the control API.
func (n *napd) sleepModel(ctx context.Context, model string) error {
	return control.NewClient(n.socket).Sleep(ctx, model, "")
}

// memory reads napd's resident set and its peak from /proc.
func (n *napd) memory() (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			hwm = kb << 10
		}
	}
	return rss, hwm, nil
}

// engineCPU is the CPU time model's engine has used so far, nil when n
// runs no engine on its port.
func (n *napd) engineCPU(model string) func() time.Duration {
	pid := engineOf(n.cmd.Process.Pid, n.engines[model])
	if pid == 0 {
		return nil
	}
	return func() time.Duration { return procCPU(pid) }
}

// cpu is the CPU time napd has used so far.
func (n *napd) cpu() time.Duration { return procCPU(n.cmd.Process.Pid) }

// settle waits, at most limit, until napd is idle: no CPU tick used over a
// quarter of a second.
func (n *napd) settle(limit time.Duration) {
	for end := time.Now().Add(limit); time.Now().Before(end); {
		before := n.cpu()
		time.Sleep(250 * time.Millisecond)
		if n.cpu() == before {
			return
		}
	}
}

// procCPU is the CPU time process pid has used so far (user and system).
func procCPU(pid int) time.Duration { return procTimes(pid).total() }

// cpuTimes is CPU time used in user space and in the kernel.
type cpuTimes struct{ user, sys time.Duration }

func (t cpuTimes) total() time.Duration { return t.user + t.sys }

func (t cpuTimes) add(u cpuTimes) cpuTimes { return cpuTimes{t.user + u.user, t.sys + u.sys} }

func (t cpuTimes) sub(u cpuTimes) cpuTimes { return cpuTimes{t.user - u.user, t.sys - u.sys} }

// procTimes is the CPU time process pid has used so far, from
// /proc/PID/stat in clock ticks of 10 ms (USER_HZ is 100 on Linux).
func procTimes(pid int) cpuTimes {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTimes{}
	}
	// The fields after the command name, which is in parentheses.
	_, rest, _ := bytes.Cut(b, []byte(") "))
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return cpuTimes{}
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return cpuTimes{time.Duration(utime) * 10 * time.Millisecond, time.Duration(stime) * 10 * time.Millisecond}
}

// procSwitches is the context switches of all of pid's threads so far.
func procSwitches(pid int) int64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += x
			}
		}
	}
	return n
}

// treeSwitches is procSwitches of pid and its children.
func treeSwitches(pid int) int64 {
	n := procSwitches(pid)
	for _, c := range children(pid) {
		n += procSwitches(c)
	}
	return n
}

// children are pid's child processes: those of each of its threads (a
// Go program starts a child from whichever thread runs the goroutine).
func children(pid int) []int {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var pids []int
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, c := range strings.Fields(string(b)) {
			if k, err := strconv.Atoi(c); err == nil {
				pids = append(pids, k)
			}
		}
	}
	return pids
}

// treeTimes is procTimes of pid and its children (nginx's workers).
func treeTimes(pid int) cpuTimes {
	t := procTimes(pid)
	for _, c := range children(pid) {
		t = t.add(procTimes(c))
	}
	return t
}

// engineOf is the child of napd (pid) that runs the engine on port (its
// command line holds -port PORT or --port PORT), 0 when there is none.
func engineOf(pid, port int) int {
	p := strconv.Itoa(port)
	for _, c := range children(pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if (args[i] == "-port" || args[i] == "--port") && args[i+1] == p {
				return c
			}
		}
	}
	return 0
}

// handedOut are the ports freePorts gave so far: an engine's port is free
// until napd wakes the engine, and must not be given to another listener
// meanwhile.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePorts reserves k distinct free loopback ports, none given before.
func freePorts(k int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	handedOut.Lock()
	defer handedOut.Unlock()
	var ports []int
	for len(ports) < k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l) // held until the end: the kernel gives another next
		if p := l.Addr().(*net.TCPAddr).Port; !handedOut.ports[p] {
			handedOut.ports[p] = true
			ports = append(ports, p)
		}
	}
	return ports, nil
}
