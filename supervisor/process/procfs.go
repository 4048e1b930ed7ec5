package process

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// procFS reads process groups and memory from /proc and the cgroup tree;
// the roots are fields so tests can point them at fixture trees.
type procFS struct {
	proc   string // "/proc"
	cgroup string // "/sys/fs/cgroup"
}

var hostFS = procFS{proc: "/proc", cgroup: "/sys/fs/cgroup"}

// groupPIDs lists the live (non-zombie) processes of process group pgid.
func (p procFS) groupPIDs(pgid int) []int {
	entries, err := os.ReadDir(p.proc)
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(p.proc, e.Name(), "stat"))
		if err != nil {
			continue // exited while we looked
		}
		state, pgrp, err := parseStat(b)
		if err == nil && pgrp == pgid && state != 'Z' && state != 'X' {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// parseStat reads the state and process group from a /proc/<pid>/stat line.
// The command name may hold spaces and parentheses, so fields are counted
// from the last ')'.
func parseStat(b []byte) (state byte, pgrp int, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// state ppid pgrp …
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, errors.New("stat: too few fields")
	}
	pgrp, err = strconv.Atoi(f[2])
	if err != nil {
		return 0, 0, fmt.Errorf("stat: pgrp: %w", err)
	}
	return f[0][0], pgrp, nil
}

// Memory sources named in Status.Reason.
const (
	memCgroup = "memory: engine cgroup"
	memRSS    = "memory: VmRSS sum of the process group"
)

// memory measures the engine whose group leader is leader: its cgroup's
// usage when the engine has a cgroup of its own (not napd's), else the sum
// of VmRSS over pids. It says which in the returned source.
func (p procFS) memory(leader int, pids []int) (int64, string, error) {
	if file, ok := p.ownCgroupFile(leader); ok {
		if b, err := os.ReadFile(file); err == nil {
			if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return n, memCgroup + " " + file, nil
			}
		}
	}
	var sum int64
	var found bool
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join(p.proc, strconv.Itoa(pid), "status"))
		if err != nil {
			continue
		}
		if n, err := parseVmRSS(b); err == nil {
			sum += n
			found = true
		}
	}
	if !found {
		return 0, "", errors.New("no VmRSS for the process group")
	}
	return sum, memRSS, nil
}

// ownCgroupFile is the memory usage file of leader's cgroup when it differs
// from napd's own; a child that shares napd's cgroup has none of its own.
func (p procFS) ownCgroupFile(leader int) (string, bool) {
	theirs, err := os.ReadFile(filepath.Join(p.proc, strconv.Itoa(leader), "cgroup"))
	if err != nil {
		return "", false
	}
	ours, err := os.ReadFile(filepath.Join(p.proc, "self", "cgroup"))
	if err != nil {
		return "", false
	}
	tv1, tv2 := parseCgroup(theirs)
	ov1, ov2 := parseCgroup(ours)
	switch {
	case tv1 != "" && tv1 != ov1:
		return filepath.Join(p.cgroup, "memory", tv1, "memory.usage_in_bytes"), true
	case tv1 == "" && tv2 != "" && tv2 != ov2:
		return filepath.Join(p.cgroup, tv2, "memory.current"), true
	}
	return "", false
}

// parseCgroup reads a /proc/<pid>/cgroup file: the cgroup v1 memory
// controller's path, and the unified (v2) path.
func parseCgroup(b []byte) (v1Memory, v2 string) {
	for line := range strings.SplitSeq(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			v1Memory = parts[2]
		}
	}
	return v1Memory, v2
}

// parseVmRSS reads VmRSS from a /proc/<pid>/status file, in bytes.
func parseVmRSS(b []byte) (int64, error) {
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: VmRSS %q", rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > 1<<40 {
			return 0, fmt.Errorf("status: VmRSS %q", rest)
		}
		return kb << 10, nil
	}
	return 0, errors.New("status: no VmRSS")
}
