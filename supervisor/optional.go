package supervisor

import (
	"context"
	"fmt"
)

// The calls below are what napd asks of an engine beyond waking and
// sleeping it. Callers use them through the Supervisor, never by asserting
// a concrete backend: what only one backend can do is a small optional
// interface here, and the Supervisor answers for backends without it.

// Pruner is a Backend that finds engines of models napd no longer
// configures (systemd: napd-engine-* units outlive napd).
type Pruner interface {
	// StopUnknown stops the engines of models not in keep and returns
	// those models, sorted.
	StopUnknown(ctx context.Context, keep []string) ([]string, error)
}

// LogReader is a Backend that can show an engine's output, or say where it
// is kept.
type LogReader interface {
	// Logs returns the last lines of the engine's output.
	Logs(spec Spec, lines int) ([]string, error)
}

// Adopter is a Backend that can tell whether the engine it finds running
// for a model was started from the model's spec (a container's labels
// record it) and removes one that was not, so that an engine of an older
// config is never adopted.
type Adopter interface {
	// Adopt removes what runs for spec's model unless it is spec's.
	Adopt(ctx context.Context, spec Spec) error
}

// Uniter is a Backend that runs each engine as a named systemd unit.
type Uniter interface {
	UnitName(spec Spec) string
}

// Name is the backend's name: "systemd" or "exec".
func (s *Supervisor) Name() string { return s.backend.Name() }

// Status is the backend's view of the engine's process: state, PIDs and
// memory.
func (s *Supervisor) Status(ctx context.Context, spec Spec) (Status, error) {
	return s.backend.Status(ctx, spec)
}

// StopUnknown stops the engines of models not in keep, where the backend
// can find them (Pruner); other backends stop none.
func (s *Supervisor) StopUnknown(ctx context.Context, keep []string) ([]string, error) {
	if p, ok := s.backend.(Pruner); ok {
		return p.StopUnknown(ctx, keep)
	}
	return nil, nil
}

// Logs returns the last lines of the engine's output (LogReader), or an
// error that says where the output is.
func (s *Supervisor) Logs(spec Spec, lines int) ([]string, error) {
	if r, ok := s.backend.(LogReader); ok {
		return r.Logs(spec, lines)
	}
	return nil, fmt.Errorf("the %s backend keeps no engine output", s.backend.Name())
}

// UnitName is the systemd unit that runs the engine, or "" when the
// backend runs no units.
func (s *Supervisor) UnitName(spec Spec) string {
	if u, ok := s.backend.(Uniter); ok {
		return u.UnitName(spec)
	}
	return ""
}
