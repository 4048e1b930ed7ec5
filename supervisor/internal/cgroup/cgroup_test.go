//go:build linux

package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var fixtures = Reader{ProcRoot: "testdata/proc", CgroupRoot: "testdata/sys"}

func TestReader_PathsOfPID(t *testing.T) {
	tests := []struct {
		pid  int
		want Paths
	}{
		{4242, Paths{Unified: "/system.slice/napd-engine-qwen3-8b.service"}},
		{777, Paths{
			Unified: "/user.slice/user-1000.slice/session-3.scope",
			Memory:  "/user.slice/user-1000.slice/session-3.scope",
		}},
		{555, Paths{Unified: "/", Memory: "/process_api/3b18b4785d9d90e87bfcd65cf8031e14"}},
	}
	for _, tt := range tests {
		got, err := fixtures.PathsOfPID(tt.pid)
		if err != nil {
			t.Fatalf("pid %d: %v", tt.pid, err)
		}
		if got != tt.want {
			t.Errorf("pid %d: got %+v, want %+v", tt.pid, got, tt.want)
		}
	}
}

func TestReader_MemoryOfPID(t *testing.T) {
	for pid, want := range map[int]int64{4242: 21474836480, 777: 1234567890} {
		got, err := fixtures.MemoryOfPID(pid)
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		if got != want {
			t.Errorf("pid %d: %d bytes, want %d", pid, got, want)
		}
	}
}

func TestReader_MemoryMissingFiles(t *testing.T) {
	_, err := fixtures.MemoryOfPID(555)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("err = %v, want fs.ErrNotExist", err)
	}
	if _, err := fixtures.MemoryOfPID(1); err == nil {
		t.Error("pid without /proc entry: want an error")
	}
}

func TestReader_MemoryMalformed(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(root+"/memory.current", []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (Reader{CgroupRoot: root}).Memory(Paths{Unified: "/"}); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("err = %v, want a parse error", err)
	}
}

func TestReader_OwnProcess(t *testing.T) {
	if _, err := (Reader{}).PathsOfPID(os.Getpid()); err != nil {
		t.Errorf("own cgroup: %v", err)
	}
}

func TestParseProcCgroup_Malformed(t *testing.T) {
	for _, text := range []string{
		"",
		"garbage\n",
		"0:/no-third-field\n",
		"x::/path\n",
		"0::relative\n",
		"3:cpu:/\n",
	} {
		if got, err := ParseProcCgroup([]byte(text)); err == nil {
			t.Errorf("ParseProcCgroup(%q) = %+v, want an error", text, got)
		}
	}
}

func TestParseProcCgroup_PathWithColon(t *testing.T) {
	got, err := ParseProcCgroup([]byte("0::/system.slice/a:b.service\n"))
	if err != nil || got.Unified != "/system.slice/a:b.service" {
		t.Errorf("got %+v, %v", got, err)
	}
}

func FuzzParseProcCgroup(f *testing.F) {
	for _, pid := range []string{"4242", "777", "555"} {
		text, err := os.ReadFile(fixtures.ProcRoot + "/" + pid + "/cgroup")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(text)
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		p, err := ParseProcCgroup(text)
		if err != nil {
			return
		}
		if p.Unified == "" && p.Memory == "" {
			t.Fatal("accepted text without a memory hierarchy")
		}
	})
}

func TestParsePIDs(t *testing.T) {
	if got := ParsePIDs([]byte("12\n0\nx\n345\n")); !slices.Equal(got, []int{12, 345}) {
		t.Errorf("got %v", got)
	}
}

func FuzzParsePIDs(f *testing.F) {
	f.Add([]byte("1\n2\n"))
	f.Add([]byte(""))
	f.Add([]byte("-1\n99999999999999999999\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, p := range ParsePIDs(data) {
			if p <= 0 {
				t.Fatalf("non-positive pid %d", p)
			}
		}
	})
}

// A group's processes, its sub-groups' included, are read from cgroup v2,
// else from the hybrid layout's unified or name=systemd hierarchy.
func TestReader_Procs(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "system.slice/a.service/cgroup.procs"), "10\n11\n")
	writeFile(t, filepath.Join(root, "systemd/system.slice/b.service/cgroup.procs"), "20\n")
	// podman --cgroups=split: the unit's own group is empty, conmon and the
	// container sit in groups below it.
	writeFile(t, filepath.Join(root, "system.slice/c.service/cgroup.procs"), "")
	writeFile(t, filepath.Join(root, "system.slice/c.service/runtime/cgroup.procs"), "30\n")
	writeFile(t, filepath.Join(root, "system.slice/c.service/libpod-payload-1/cgroup.procs"), "31\n32\n")
	r := Reader{CgroupRoot: root}
	if got := r.Procs("/system.slice/c.service"); !slices.Equal(slices.Sorted(slices.Values(got)), []int{30, 31, 32}) {
		t.Errorf("sub-groups: %v", got)
	}
	if got := r.Procs("/system.slice/a.service"); !slices.Equal(got, []int{10, 11}) {
		t.Errorf("v2: %v", got)
	}
	if got := r.Procs("/system.slice/b.service"); !slices.Equal(got, []int{20}) {
		t.Errorf("hybrid: %v", got)
	}
	if got := r.Procs("/system.slice/none.service"); got != nil {
		t.Errorf("missing group: %v", got)
	}
	if got := r.Procs(""); got != nil {
		t.Errorf("no group: %v", got)
	}
}

// A process has a cgroup of its own only when it differs from napd's: in
// the v1 memory hierarchy when listed, else in v2.
func TestReader_Own(t *testing.T) {
	for _, c := range []struct {
		name, self, theirs string
		own                bool
	}{
		{"v2 shared", "0::/napd.service\n", "0::/napd.service\n", false},
		{"v2 own", "0::/napd.service\n", "0::/napd.slice/engine\n", true},
		{"v1 shared, v2 differs", "4:memory:/napd\n0::/a\n", "4:memory:/napd\n0::/b\n", false},
		{"v1 own", "4:memory:/napd\n0::/\n", "4:memory:/engines/7\n0::/\n", true},
	} {
		root := t.TempDir()
		for pid, text := range map[string]string{"self": c.self, "7": c.theirs} {
			if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, pid, "cgroup"), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, own := (Reader{ProcRoot: root}).Own(7); own != c.own {
			t.Errorf("%s: own = %v, want %v", c.name, own, c.own)
		}
	}
	if _, own := (Reader{ProcRoot: t.TempDir()}).Own(7); own {
		t.Error("a process without /proc entry has a cgroup of its own")
	}
}

// A container's processes are those of the group its one reported PID is
// in: the v1 memory hierarchy on a hybrid host (podman's libpod_parent,
// docker's /docker/ID), else v2.
func TestReader_ProcsOfPID(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "proc/9/cgroup"), "4:memory:/libpod_parent/libpod-abc\n0::/libpod_parent/libpod-abc\n")
	writeFile(t, filepath.Join(root, "sys/memory/libpod_parent/libpod-abc/cgroup.procs"), "9\n12\n")
	writeFile(t, filepath.Join(root, "proc/5/cgroup"), "0::/docker/def\n")
	writeFile(t, filepath.Join(root, "sys/docker/def/cgroup.procs"), "5\n")
	r := Reader{ProcRoot: filepath.Join(root, "proc"), CgroupRoot: filepath.Join(root, "sys")}
	if got := r.ProcsOfPID(9); !slices.Equal(got, []int{9, 12}) {
		t.Errorf("v1 memory hierarchy: %v", got)
	}
	if got := r.ProcsOfPID(5); !slices.Equal(got, []int{5}) {
		t.Errorf("v2: %v", got)
	}
	if got := r.ProcsOfPID(77); got != nil {
		t.Errorf("no such process: %v", got)
	}
}

// writeFile writes a fixture file, making its directories.
func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
