// Package procio reads how many bytes processes have read, from
// /proc/PID/io's rchar: what napd measures a waking engine's load by
// (docs/lifecycle.md#load-progress). rchar counts every read(2) and
// pread(2), from the page cache or the disk alike, so a warm load shows
// the same progress as a cold one, only faster; mmap'd pages faulted in
// are not counted (an engine that maps its weights shows no progress).
package procio

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// ParseRchar returns the rchar field of /proc/PID/io's text.
func ParseRchar(data []byte) (uint64, error) {
	for line := range bytes.Lines(data) {
		k, v, ok := bytes.Cut(bytes.TrimRight(line, "\n"), []byte(":"))
		if !ok || string(k) != "rchar" {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("rchar: %w", err)
		}
		return n, nil
	}
	return 0, errors.New("no rchar line")
}

// Reader reads /proc/PID/io under Root ("" is /proc).
type Reader struct {
	Root string
}

// Read returns rchar of each of pids that could be read: a process that
// exited, or whose io file napd may not read (another user's, without
// CAP_SYS_PTRACE), is left out. err is the first failure when none could
// be read.
func (r Reader) Read(pids []int) (map[int]uint64, error) {
	root := r.Root
	if root == "" {
		root = "/proc"
	}
	out := make(map[int]uint64, len(pids))
	var first error
	for _, pid := range pids {
		data, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "io"))
		if err == nil {
			var n uint64
			if n, err = ParseRchar(data); err == nil {
				out[pid] = n
				continue
			}
		}
		if first == nil {
			first = fmt.Errorf("read io of pid %d: %w", pid, err)
		}
	}
	if len(out) == 0 && first != nil {
		return nil, first
	}
	return out, nil
}
