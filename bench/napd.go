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
	"syscall"
	"time"

	"github.com/napd/napd/agent/control"
)

// wakeDelays are the engine start-up times the wake figure is taken at:
// short, and long enough for napd's health polling to have slowed down.
var wakeDelays = []time.Duration{300 * time.Millisecond, time.Second, 2 * time.Second}

// napd is the napd process under test and the engines it supervises.
type napd struct {
	dir        string
	addr       string // gateway host:port
	enginePort int    // the "proxy" model's engine, for direct requests
	engine1    int    // the "proxy1" model's engine: the same on one thread
	demoPort   int    // the "demo" model's engine (napd-demo-engine)
	socket     string
	cmd        *exec.Cmd
	log        bytes.Buffer
	exited     chan struct{}
}

// wakeModel names the model whose engine starts in d.
func wakeModel(d time.Duration) string { return "wake-" + d.String() }

// readyFile is where the wake model's engine writes when it turns healthy.
func (n *napd) readyFile(d time.Duration) string {
	return filepath.Join(n.dir, wakeModel(d)+".ready")
}

// startNapd writes a config with the "proxy" model (the bench engine, no
// start-up delay), "proxy1" (the same on one thread), the "demo" model (napd-demo-engine answering at once)
// and one "wake-D" model per wake delay, and starts napd from binDir on
// it. self is this program, run by napd as the engine.
func startNapd(binDir, self string) (*napd, error) {
	dir, err := os.MkdirTemp("", "napd-bench-")
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	n := &napd{
		dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), enginePort: ports[1], demoPort: ports[2], engine1: ports[3],
		socket: filepath.Join(dir, "control.sock"), exited: make(chan struct{}),
	}
	var cfg strings.Builder
	cfg.WriteString(n.baseConfig("5m"))
	fmt.Fprintf(&cfg, `
[policy]
idle_timeout = "0"
wake_timeout = "30s"

[models.proxy]
command = [%q, "-engine", "-port", "${PORT}"]
port = %d
sleep = "stop"
max_concurrency = 16384
queue = 4096

[models.proxy1]
command = [%q, "-engine", "-port", "${PORT}", "-procs", "1"]
port = %d
sleep = "stop"
max_concurrency = 16384
queue = 4096

[models.demo]
command = [%q, "--host", "127.0.0.1", "--port", "${PORT}", "--model", "demo", "--ttft", "0", "--tokens-per-second", "0"]
port = %d
sleep = "stop"
max_concurrency = 4096
queue = 4096
`, self, n.enginePort, self, n.engine1, filepath.Join(binDir, "napd-demo-engine"), n.demoPort)
	for _, d := range wakeDelays {
		fmt.Fprintf(&cfg, `
[models.%q]
command = [%q, "-engine", "-port", "${PORT}", "-startup-delay", %q, "-ready-file", %q]
sleep = "stop"
`, wakeModel(d), self, d.String(), n.readyFile(d))
	}
	if err := n.launch(binDir, cfg.String(), nil); err != nil {
		return nil, err
	}
	return n, nil
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

// engineOf is the child of napd (pid) that runs the bench engine on port,
// 0 when there is none.
func engineOf(pid, port int) int {
	want := fmt.Sprintf("\x00-engine\x00-port\x00%d\x00", port)
	for _, c := range children(pid) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c)); err == nil && strings.Contains(string(b), want) {
			return c
		}
	}
	return 0
}

// freePorts reserves k distinct free loopback ports.
func freePorts(k int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
