package container

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/napd/napd/supervisor/internal/cgroup"
)

// procs finds a container's processes and memory on the host: the group
// of the PID its runtime reports (all of the container's processes, an
// engine's workers included), podman's conmon (it holds a published
// port), and docker's docker-proxy for a published port. Tests point it at
// fixture trees.
type procs struct {
	cg   cgroup.Reader
	proc string // "" = /proc
}

// of returns the processes of a running container, the memory charged to
// its cgroup (ok false when unread), and docker-proxy's PID for reuse.
func (p procs) of(c *record) (pids []int, mem int64, memOK bool) {
	if c.pid > 0 {
		pids = p.cg.ProcsOfPID(c.pid)
		if len(pids) == 0 {
			pids = []int{c.pid}
		}
		if m, err := p.cg.MemoryOfPID(c.pid); err == nil {
			mem, memOK = m, true
		}
	}
	if c.conmonPid > 0 && p.alive(c.conmonPid) && !slices.Contains(pids, c.conmonPid) {
		pids = append(pids, c.conmonPid)
	}
	if c.runtime == Docker && c.containerPort > 0 {
		if c.proxyPid == 0 || !p.isProxy(c.proxyPid, c) {
			c.proxyPid = p.findProxy(c)
		}
		if c.proxyPid > 0 {
			pids = append(pids, c.proxyPid)
		}
	}
	return pids, mem, memOK
}

func (p procs) root() string {
	if p.proc == "" {
		return "/proc"
	}
	return p.proc
}

func (p procs) alive(pid int) bool {
	_, err := os.Stat(filepath.Join(p.root(), strconv.Itoa(pid)))
	return err == nil
}

// findProxy is the docker-proxy that forwards c's published port: docker
// runs one per port, `docker-proxy -proto tcp -host-ip 127.0.0.1
// -host-port P -container-ip IP -container-port N`, a child of dockerd.
func (p procs) findProxy(c *record) int {
	entries, _ := os.ReadDir(p.root())
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && p.isProxy(pid, c) {
			return pid
		}
	}
	return 0
}

func (p procs) isProxy(pid int, c *record) bool {
	b, err := os.ReadFile(filepath.Join(p.root(), strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	argv := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	if len(argv) == 0 || filepath.Base(string(argv[0])) != "docker-proxy" {
		return false
	}
	want := map[string]string{
		"-host-port":      strconv.Itoa(c.hostPort),
		"-container-port": strconv.Itoa(c.containerPort),
		"-container-ip":   c.ip,
	}
	for i := 0; i+1 < len(argv); i++ {
		if v, ok := want[string(argv[i])]; ok && v == string(argv[i+1]) {
			delete(want, string(argv[i]))
		}
	}
	return len(want) == 0
}
