package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"testing"
)

var fixtures = Reader{ProcRoot: "../testdata/cgroup/proc", CgroupRoot: "../testdata/cgroup/sys"}

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
	if _, err := (Reader{CgroupRoot: root}).Memory(Paths{Unified: "/"}); err == nil || errors.Is(err, fs.ErrNotExist) {
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
