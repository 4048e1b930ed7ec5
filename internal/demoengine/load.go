package demoengine

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// loadChunk is the size of one read of LoadFiles: large enough that the
// reads cost little, small enough that a throttle paces them evenly.
const loadChunk = 1 << 20

// loadState is the progress of reading LoadFiles, guarded by Engine.mu.
type loadState struct {
	done  bool
	read  int64 // bytes read so far
	total int64 // bytes of every file to read
}

// LoadPaths lists the regular files a load of path reads: path itself, or
// every regular file directly in it when it is a directory (sorted, as
// os.ReadDir returns them).
func LoadPaths(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().IsRegular() {
		return []string{path}, nil
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: not a regular file or directory", path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, de := range entries {
		if de.Type().IsRegular() {
			files = append(files, filepath.Join(path, de.Name()))
		}
	}
	return files, nil
}

// startLoad reads LoadFiles in its own goroutine, through read(2) as an
// engine reads its weights (so that the process's I/O counters and the
// page cache see it), paced to LoadRate. /health answers 503 until it
// ends; a file that cannot be read ends the process with status 1, as an
// engine that cannot load its weights exits.
func (e *Engine) startLoad() {
	if len(e.opts.LoadFiles) == 0 {
		e.load.done = true
		return
	}
	var total int64
	for _, f := range e.opts.LoadFiles {
		if fi, err := os.Stat(f); err == nil {
			total += fi.Size()
		}
	}
	e.load.total = total
	go func() {
		err := e.readLoadFiles()
		e.mu.Lock()
		e.load.done = err == nil
		e.mu.Unlock()
		if err != nil {
			e.log.Error("loading weights failed", "err", err)
			e.exit(1)
			return
		}
		e.log.Info("weights loaded", "bytes", total, "seconds", time.Since(e.started).Seconds())
	}()
}

func (e *Engine) readLoadFiles() error {
	buf := make([]byte, loadChunk)
	start := time.Now()
	var n int64
	for _, path := range e.opts.LoadFiles {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("load %s: %w", path, err)
		}
		for {
			k, err := f.Read(buf)
			n += int64(k)
			e.mu.Lock()
			e.load.read = n
			e.mu.Unlock()
			if rate := e.opts.LoadRate; rate > 0 {
				// Paced as a whole, so that short reads do not slow it.
				due := start.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
				time.Sleep(time.Until(due))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				f.Close()
				return fmt.Errorf("load %s: %w", path, err)
			}
		}
		f.Close()
	}
	return nil
}
