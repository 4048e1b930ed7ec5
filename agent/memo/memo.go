// Package memo remembers one positive number per model in a JSON file under
// state_dir, written atomically, so that what napd learned survives a
// restart: each model's GPU footprint (footprints.json), and the port napd
// allocated for a model with port = 0 (ports.json), so a restarted napd
// finds the engine it adopts, and the GPUs napd chose for a model with
// gpus = "any" or { count = N } (placements.json, a bitmask of indexes).
//
// It owns those two files. It must not store anything but one number per
// model (never request data), and it writes only through internal/statefile.
package memo

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"sync"

	"github.com/napd/napd/internal/statefile"
)

// maxSize bounds a store's file: a number per model is a few dozen bytes.
const maxSize = 1 << 20

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
	data, err := statefile.Read(s.path, maxSize)
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
	return statefile.Write(s.path, append(data, '\n'), 0o644)
}
