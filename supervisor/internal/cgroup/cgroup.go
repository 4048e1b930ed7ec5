//go:build linux

// Package cgroup is the one cgroup reader of napd's supervisor backends: it
// finds a process's control group, reads the memory the group uses (cgroup
// v2 memory.current, v1 memory.usage_in_bytes) and lists a group's
// processes (cgroup.procs). The exec backend measures its engines with it;
// the systemd backend lists a unit's processes with it (systemd reports the
// unit's memory itself). It only reads: it never moves a process or writes
// a cgroup file.
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Paths is where a process sits in the cgroup hierarchies, as listed in
// /proc/PID/cgroup. Each path is absolute within its hierarchy ("/" is the
// root); "" means the process is not in that hierarchy.
type Paths struct {
	Unified string // the v2 hierarchy: line "0::/path"
	Memory  string // the v1 memory controller: line "N:…memory…:/path"
}

// ParseProcCgroup parses the text of /proc/PID/cgroup. Lines are
// "hierarchy-ID:controller-list:path"; the path may itself contain ':'.
func ParseProcCgroup(text []byte) (Paths, error) {
	var p Paths
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		controllers, path, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			return Paths{}, fmt.Errorf("cgroup line %d: want id:controllers:path, got %q", n, line)
		}
		if _, err := strconv.ParseUint(id, 10, 32); err != nil {
			return Paths{}, fmt.Errorf("cgroup line %d: hierarchy id %q: %w", n, id, err)
		}
		if !strings.HasPrefix(path, "/") {
			return Paths{}, fmt.Errorf("cgroup line %d: path %q is not absolute", n, path)
		}
		if id == "0" && controllers == "" {
			p.Unified = path
			continue
		}
		for _, c := range strings.Split(controllers, ",") {
			if c == "memory" {
				p.Memory = path
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Paths{}, fmt.Errorf("cgroup: %w", err)
	}
	if p.Unified == "" && p.Memory == "" {
		return Paths{}, errors.New("cgroup: neither a v2 nor a v1 memory hierarchy listed")
	}
	return p, nil
}

// Reader reads cgroup memory from a /proc and a /sys/fs/cgroup tree; tests
// point it at fixture trees.
type Reader struct {
	ProcRoot   string // "" = "/proc"
	CgroupRoot string // "" = "/sys/fs/cgroup"
}

// PathsOfPID reads /proc/PID/cgroup.
func (r Reader) PathsOfPID(pid int) (Paths, error) {
	file := filepath.Join(or(r.ProcRoot, "/proc"), strconv.Itoa(pid), "cgroup")
	text, err := os.ReadFile(file)
	if err != nil {
		return Paths{}, fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	p, err := ParseProcCgroup(text)
	if err != nil {
		return Paths{}, fmt.Errorf("cgroup of pid %d: %w", pid, err)
	}
	return p, nil
}

// Own is the cgroup of pid when it is not napd's own: a process napd
// started without a cgroup of its own shares napd's, whose memory is not
// the engine's. ok is false when it shares it or either cannot be read.
func (r Reader) Own(pid int) (p Paths, ok bool) {
	theirs, err := r.PathsOfPID(pid)
	if err != nil {
		return Paths{}, false
	}
	text, err := os.ReadFile(filepath.Join(or(r.ProcRoot, "/proc"), "self", "cgroup"))
	if err != nil {
		return Paths{}, false
	}
	ours, err := ParseProcCgroup(text)
	if err != nil {
		return Paths{}, false
	}
	// Memory is accounted in the v1 memory hierarchy when it is listed.
	if theirs.Memory != "" {
		return theirs, theirs.Memory != ours.Memory
	}
	return theirs, theirs.Unified != "" && theirs.Unified != ours.Unified
}

// Memory returns the bytes charged to the cgroup and the file it read. On
// a hybrid host, where the v1 memory controller is mounted, memory is
// accounted there and the v2 group has no memory.current; so v1 is tried
// first when listed.
func (r Reader) Memory(p Paths) (int64, string, error) {
	root := or(r.CgroupRoot, "/sys/fs/cgroup")
	var tried []string
	if p.Memory != "" {
		file := filepath.Join(root, "memory", p.Memory, "memory.usage_in_bytes")
		v, err := readBytes(file)
		if !errors.Is(err, fs.ErrNotExist) {
			return v, file, err
		}
		tried = append(tried, file)
	}
	if p.Unified != "" {
		file := filepath.Join(root, p.Unified, "memory.current")
		v, err := readBytes(file)
		if !errors.Is(err, fs.ErrNotExist) {
			return v, file, err
		}
		tried = append(tried, file)
	}
	return 0, "", fmt.Errorf("cgroup memory: none of %s exists: %w", strings.Join(tried, ", "), fs.ErrNotExist)
}

// MemoryOfPID returns the memory of the cgroup PID runs in (a container's
// engine: the runtime reports its PID, not its group).
func (r Reader) MemoryOfPID(pid int) (int64, error) {
	p, err := r.PathsOfPID(pid)
	if err != nil {
		return 0, err
	}
	v, _, err := r.Memory(p)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return v, nil
}

// Procs lists the processes of the group at path (a path within the
// hierarchy, as systemd's ControlGroup property gives it) and of the groups
// below it: cgroup v2, then the hybrid layout's unified and name=systemd
// hierarchies. Groups below count because a unit's processes may sit in
// sub-groups (podman --cgroups=split puts conmon and the container there).
// nil when none can be read.
func (r Reader) Procs(path string) []int {
	if path == "" {
		return nil
	}
	root := or(r.CgroupRoot, "/sys/fs/cgroup")
	for _, h := range []string{"", "unified", "systemd"} {
		if pids, ok := treeProcs(filepath.Join(root, h, path)); ok {
			return pids
		}
	}
	return nil
}

// ProcsOfPID lists the processes of the group pid runs in (and of the
// groups below it), read in the hierarchy that holds its memory: a
// container's processes, found from the one PID its runtime reports.
func (r Reader) ProcsOfPID(pid int) []int {
	p, err := r.PathsOfPID(pid)
	if err != nil {
		return nil
	}
	if p.Memory != "" {
		if pids, ok := treeProcs(filepath.Join(or(r.CgroupRoot, "/sys/fs/cgroup"), "memory", p.Memory)); ok {
			return pids
		}
	}
	return r.Procs(p.Unified)
}

// treeProcs reads cgroup.procs of dir and of every group below it; ok is
// false when dir's own cannot be read.
func treeProcs(dir string) (pids []int, ok bool) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, false
	}
	pids = ParsePIDs(data)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			sub, _ := treeProcs(filepath.Join(dir, e.Name()))
			pids = append(pids, sub...)
		}
	}
	return pids, true
}

// ParsePIDs parses cgroup.procs: one pid a line; other lines are skipped.
func ParsePIDs(data []byte) []int {
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

func readBytes(file string) (int64, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(text)), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%s: %q is not a byte count", file, bytes.TrimSpace(text))
	}
	return v, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
