// Package memo remembers one positive number per model in a JSON file under
// state_dir, written atomically, so that what napd learned survives a
// restart: each model's GPU footprint (footprints.json), and the port napd
// allocated for a model with port = 0 (ports.json), so a restarted napd
// finds the engine it adopts.
package memo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"
)

// Store is one file of remembered numbers. It is safe for concurrent use.
type Store struct {
	path string

	mu    sync.Mutex
	bytes map[string]int64
}

// Open loads the store from path. A missing file is an empty store; a
// corrupt one is an error (the operator should see it, not lose it silently).
func Open(path string) (*Store, error) {
	s := &Store{path: path, bytes: make(map[string]int64)}
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.path, err)
	}
	if err := json.Unmarshal(data, &s.bytes); err != nil {
		return nil, fmt.Errorf("%s: %w", s.path, err)
	}
	for model, b := range s.bytes {
		if b <= 0 {
			return nil, fmt.Errorf("%s: %q has %d, want a positive number", s.path, model, b)
		}
	}
	return s, nil
}

// Get returns the number remembered for model.
func (s *Store) Get(model string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bytes[model]
	return b, ok
}

// All returns a copy of every remembered number.
func (s *Store) All() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.bytes)
}

// Remember records model's number and writes the file when the value
// changed. Non-positive values are ignored: a footprint measured at 0 bytes
// was not measured.
func (s *Store) Remember(model string, bytes int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if bytes <= 0 || s.bytes[model] == bytes {
		return nil
	}
	next := maps.Clone(s.bytes)
	next[model] = bytes
	if err := s.write(next); err != nil {
		return err
	}
	s.bytes = next
	return nil
}

// write replaces the file atomically: a crash leaves the old or the new
// content, never a torn one.
func (s *Store) write(m map[string]int64) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	dir := filepath.Dir(s.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(s.path)+".*")
	if err != nil {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	_, err = tmp.Write(append(data, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), s.path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", s.path, err)
	}
	// The rename is durable only once the directory is synced.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
