//go:build linux

package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// spoolMemory is how much of a form's head a spool keeps in memory; the
// rest goes to a file.
const spoolMemory = 256 << 10

// errSpool marks a failure to write the spool's file.
var errSpool = errors.New("spool")

// spool keeps the bytes the gateway read of an upload before routing it:
// the first spoolMemory bytes in memory, the rest in a file that has no
// name (O_TMPFILE; unlinked at once where that is unsupported), so no other
// process can open it and it is gone when closed, or when napd dies. Its
// size is bounded by max_body, as everything it holds was read within it.
type spool struct {
	dir  string
	mem  []byte
	file *os.File
	size int64
}

func newSpool(dir string) *spool {
	if dir == "" {
		dir = os.TempDir()
	}
	return &spool{dir: dir}
}

func (s *spool) Write(p []byte) (int, error) {
	if s.file == nil && len(s.mem)+len(p) <= spoolMemory {
		s.mem = append(s.mem, p...)
		s.size += int64(len(p))
		return len(p), nil
	}
	if s.file == nil {
		f, err := unnamedFile(s.dir)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", errSpool, err)
		}
		s.file = f
	}
	n, err := s.file.Write(p)
	s.size += int64(n)
	if err != nil {
		return n, fmt.Errorf("%w: %w", errSpool, err)
	}
	return n, nil
}

// section reads the spool's bytes [from, to).
func (s *spool) section(from, to int64) io.Reader {
	mem := int64(len(s.mem))
	var parts []io.Reader
	if from < mem {
		parts = append(parts, bytes.NewReader(s.mem[from:min(to, mem)]))
	}
	if to > mem {
		start := max(from, mem) - mem
		parts = append(parts, io.NewSectionReader(s.file, start, to-mem-start))
	}
	return io.MultiReader(parts...)
}

func (s *spool) inMemory() int { return len(s.mem) }
func (s *spool) onDisk() int64 { return s.size - int64(len(s.mem)) }

// Close frees the file, if any.
func (s *spool) Close() {
	if s.file != nil {
		_ = s.file.Close()
	}
}

// unnamedFile opens a read-write file in dir that no path reaches.
func unnamedFile(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), dir+"/(upload)"), nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EINVAL) {
		return nil, &os.PathError{Op: "open O_TMPFILE", Path: dir, Err: err}
	}
	// No O_TMPFILE on this file system: a fresh name (O_EXCL, 0600), unlinked at once.
	f, err := os.CreateTemp(dir, "napd-upload-")
	if err != nil {
		return nil, err
	}
	if err := os.Remove(f.Name()); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}
