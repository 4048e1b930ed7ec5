package container

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/napd/napd/supervisor/internal/cgroup"
)

// A container's processes: its cgroup's (found from the PID the runtime
// reports), podman's conmon, and the docker-proxy that holds its
// published port (found by its arguments, then kept while it lives); its
// memory is its cgroup's.
func TestProcs_Of(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/100/cgroup", "4:memory:/docker/abc\n0::/docker/abc\n")
	write("proc/101/cgroup", "4:memory:/docker/abc\n0::/docker/abc\n")
	write("sys/memory/docker/abc/cgroup.procs", "100\n101\n")
	write("sys/memory/docker/abc/memory.usage_in_bytes", "734003200\n")
	proxy := []string{"/usr/sbin/docker-proxy", "-proto", "tcp", "-host-ip", "127.0.0.1", "-host-port", "18983",
		"-container-ip", "172.17.0.2", "-container-port", "8000"}
	write("proc/200/cmdline", strings.Join(proxy, "\x00")+"\x00")
	other := slices.Clone(proxy)
	other[6] = "18984" // another container's port
	write("proc/201/cmdline", strings.Join(other, "\x00")+"\x00")
	write("proc/300/cmdline", "sleep\x00600\x00")

	p := procs{cg: cgroup.Reader{ProcRoot: filepath.Join(root, "proc"), CgroupRoot: filepath.Join(root, "sys")}, proc: filepath.Join(root, "proc")}
	r := &record{runtime: Docker, pid: 100, ip: "172.17.0.2", hostPort: 18983, containerPort: 8000}
	pids, mem, ok := p.of(r)
	if !slices.Equal(pids, []int{100, 101, 200}) || !ok || mem != 734003200 || r.proxyPid != 200 {
		t.Errorf("docker, published: pids %v mem %d %v proxy %d", pids, mem, ok, r.proxyPid)
	}
	if err := os.Remove(filepath.Join(root, "proc/200/cmdline")); err != nil {
		t.Fatal(err)
	}
	if pids, _, _ := p.of(r); !slices.Equal(pids, []int{100, 101}) || r.proxyPid != 0 {
		t.Errorf("the proxy gone: %v (proxy %d)", pids, r.proxyPid)
	}

	write("proc/400/cgroup", "0::/libpod_parent/libpod-x\n")
	write("proc/401/stat", "401 (conmon) S 1")
	write("sys/libpod_parent/libpod-x/cgroup.procs", "400\n")
	pod := &record{runtime: Podman, pid: 400, conmonPid: 401, hostPort: 18990, containerPort: 80}
	if pids, _, ok := p.of(pod); !slices.Equal(pids, []int{400, 401}) || ok {
		t.Errorf("podman: %v, memory %v", pids, ok)
	}
}
