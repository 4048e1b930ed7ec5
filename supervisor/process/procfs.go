//go:build linux

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

	"github.com/napd/napd/supervisor/internal/cgroup"
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
	cg := cgroup.Reader{ProcRoot: p.proc, CgroupRoot: p.cgroup}
	if paths, ok := cg.Own(leader); ok {
		if n, file, err := cg.Memory(paths); err == nil {
			return n, memCgroup + " " + file, nil
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
