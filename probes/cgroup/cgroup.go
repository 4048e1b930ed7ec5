// Package cgroup finds a process's control group and reads the memory the
// group uses, on cgroup v2 (memory.current) and v1 (memory.usage_in_bytes).
// It measures exec-backend engines; systemd units report MemoryCurrent
// through the supervisor instead.
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

// Memory returns the bytes charged to the cgroup. On a hybrid host, where
// the v1 memory controller is mounted, memory is accounted there and the v2
// group has no memory.current; so v1 is tried first when listed.
func (r Reader) Memory(p Paths) (int64, error) {
	root := or(r.CgroupRoot, "/sys/fs/cgroup")
	var tried []string
	if p.Memory != "" {
		file := filepath.Join(root, "memory", p.Memory, "memory.usage_in_bytes")
		v, err := readBytes(file)
		if !errors.Is(err, fs.ErrNotExist) {
			return v, err
		}
		tried = append(tried, file)
	}
	if p.Unified != "" {
		file := filepath.Join(root, p.Unified, "memory.current")
		v, err := readBytes(file)
		if !errors.Is(err, fs.ErrNotExist) {
			return v, err
		}
		tried = append(tried, file)
	}
	return 0, fmt.Errorf("cgroup memory: none of %s exists: %w", strings.Join(tried, ", "), fs.ErrNotExist)
}

// MemoryOfPID returns the memory of the cgroup PID runs in.
func (r Reader) MemoryOfPID(pid int) (int64, error) {
	p, err := r.PathsOfPID(pid)
	if err != nil {
		return 0, err
	}
	v, err := r.Memory(p)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return v, nil
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
