package process

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"sync"

	"github.com/napd/napd/internal/statefile"
)

// logFile is one model's output log: appended to across restarts of the
// engine, rotated to path.1 … path.keep when it would grow past max.
type logFile struct {
	path string
	max  int64
	keep int

	mu   sync.Mutex
	f    *os.File
	size int64
}

func openLog(path string, max int64, keep int) (*logFile, error) {
	l := &logFile{path: path, max: max, keep: keep}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *logFile) open() error {
	// A symlink planted in place of the log is not followed: napd is root.
	f, err := statefile.OpenAppend(l.path, 0o640)
	if err != nil {
		return fmt.Errorf("open engine log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open engine log: %w", err)
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Write appends p, rotating whenever the file would grow past max. A write
// that does not fit is split at its last newline that fits, so lines stay
// whole where they can and no file exceeds max.
func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	written := 0
	for len(p) > 0 {
		if l.f == nil {
			return written, fs.ErrClosed
		}
		room := l.max - l.size
		n := len(p)
		if int64(n) > room {
			n = bytes.LastIndexByte(p[:max(room, 0)], '\n') + 1
			if n == 0 && l.size == 0 {
				n = int(l.max) // one line longer than a whole file
			}
		}
		if n == 0 {
			if err := l.rotate(); err != nil {
				return written, err
			}
			continue
		}
		m, err := l.f.Write(p[:n])
		l.size += int64(m)
		written += m
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (l *logFile) rotate() error {
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("rotate engine log: %w", err)
	}
	l.f = nil
	for i := l.keep; i > 0; i-- {
		from := l.path
		if i > 1 {
			from += "." + strconv.Itoa(i-1)
		}
		if err := os.Rename(from, l.path+"."+strconv.Itoa(i)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rotate engine log: %w", err)
		}
	}
	if l.keep == 0 {
		if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rotate engine log: %w", err)
		}
	}
	return l.open()
}

// Close closes the file; later writes fail.
func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// tailChunk is how much of a log is read per step from its end.
const tailChunk = 64 << 10

// tailLines returns the last n lines of the file at path (without their
// newlines), reading backwards from its end so a large log costs little.
func tailLines(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	end := st.Size()
	var buf []byte
	// Stop once n+1 newlines are in view: the earliest one bounds line 1.
	for end > 0 && bytes.Count(buf, []byte{'\n'}) <= n {
		step := min(end, tailChunk)
		chunk := make([]byte, step)
		if _, err := f.ReadAt(chunk, end-step); err != nil && err != io.EOF {
			return nil, err
		}
		buf = append(chunk, buf...)
		end -= step
	}
	buf = bytes.TrimSuffix(buf, []byte{'\n'})
	if len(buf) == 0 {
		return nil, nil
	}
	lines := bytes.Split(buf, []byte{'\n'})
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = string(l)
	}
	return out, nil
}
