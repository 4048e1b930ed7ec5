//go:build linux

package process

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// writeTree writes files (path → content) under a temp root.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestProcFS_GroupAndMemory(t *testing.T) {
	root := writeTree(t, map[string]string{
		"proc/self/cgroup": "0::/system.slice/napd.service\n",
		"proc/100/stat":    "100 (vllm serve) S 1 100 100 0 -1 4194560 1 0 0 0",
		"proc/100/status":  "Name:\tvllm\nVmRSS:\t   2048 kB\n",
		"proc/100/cgroup":  "0::/system.slice/napd.service\n",
		"proc/101/stat":    "101 (worker (x) )) R 100 100 100 0 -1",
		"proc/101/status":  "VmRSS:\t1024 kB\n",
		"proc/102/stat":    "102 (zombie) Z 100 100 100",
		"proc/103/stat":    "103 (other) S 1 103 103",
		"proc/uptime":      "1 1",
		"proc/200/stat":    "200 (engine) S 1 200 200",
		"proc/200/cgroup":  "0::/napd.slice/engine-200\n",
		"proc/200/status":  "VmRSS:\t1 kB\n",
		"cg/napd.slice/engine-200/memory.current": "123456\n",
	})
	fs := procFS{proc: filepath.Join(root, "proc"), cgroup: filepath.Join(root, "cg")}

	pids := fs.groupPIDs(100)
	if len(pids) != 2 || pids[0] != 100 || pids[1] != 101 {
		t.Fatalf("groupPIDs = %v, want [100 101]", pids)
	}
	n, source, err := fs.memory(100, pids)
	if err != nil || n != 3072<<10 || source != memRSS {
		t.Errorf("shared cgroup: %d %q %v", n, source, err)
	}
	n, source, err = fs.memory(200, []int{200})
	if err != nil || n != 123456 || source != memCgroup+" "+filepath.Join(root, "cg/napd.slice/engine-200/memory.current") {
		t.Errorf("own cgroup: %d %q %v", n, source, err)
	}
	if _, _, err := fs.memory(999, []int{999}); err == nil {
		t.Error("memory of a missing process succeeded")
	}
}

func TestProcFS_CgroupV1(t *testing.T) {
	root := writeTree(t, map[string]string{
		"proc/self/cgroup": "4:memory:/napd\n0::/\n",
		"proc/7/cgroup":    "4:memory:/engines/7\n0::/\n",
		"proc/7/status":    "VmRSS:\t1 kB\n",
		"cg/memory/engines/7/memory.usage_in_bytes": "42",
	})
	fs := procFS{proc: filepath.Join(root, "proc"), cgroup: filepath.Join(root, "cg")}
	if n, _, err := fs.memory(7, []int{7}); err != nil || n != 42 {
		t.Errorf("v1 cgroup memory = %d, %v", n, err)
	}
}

func TestParseVmRSS_Errors(t *testing.T) {
	for _, in := range []string{"", "VmRSS: 12 MB", "VmRSS: x kB", "VmRSS: -1 kB"} {
		if _, err := parseVmRSS([]byte(in)); err == nil {
			t.Errorf("parseVmRSS(%q) succeeded", in)
		}
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("100 (vllm serve) S 1 100 100 0 -1"))
	f.Add([]byte("1 ((() R 0 1"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, _, err := parseStat(b); err == nil && !bytes.Contains(b, []byte(")")) {
			t.Errorf("parsed a stat line without a command name: %q", b)
		}
	})
}

func FuzzParseVmRSS(f *testing.F) {
	f.Add([]byte("Name:\tx\nVmRSS:\t 2048 kB\n"))
	f.Add([]byte("VmRSS:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := parseVmRSS(b); err == nil && n < 0 {
			t.Errorf("negative RSS %d", n)
		}
	})
}
