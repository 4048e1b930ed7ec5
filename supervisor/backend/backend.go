//go:build linux

// Package backend opens the engine supervisor's backend that napd's
// agent.supervisor names: systemd (supervisor/systemd), exec
// (supervisor/process), or auto, systemd when it answers on D-Bus; wrapped
// so that engines with an image run as containers (supervisor/container).
//
// It is the one place outside the backends' own packages that names them:
// cmd/napd hands Open to the agent (agent.Options.OpenBackend), which gets a
// supervisor.Backend from it and never links a concrete backend.
package backend

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/container"
	"github.com/napd/napd/supervisor/process"
	"github.com/napd/napd/supervisor/systemd"
)

// Open opens the backend of kind, wrapped for container engines (their
// containers of napd's swept first: the running ones kept for adoption,
// the rest removed). KindAuto asks systemd over D-Bus first and falls back
// to exec, logging the choice and why.
func Open(ctx context.Context, kind supervisor.Kind, o supervisor.OpenOptions) (supervisor.Backend, error) {
	b, err := open(ctx, kind, o)
	if err != nil {
		return nil, err
	}
	cb, err := container.New(ctx, b, container.Options{StateDir: o.StateDir, Logger: o.Logger, Runtimes: o.ContainerRuntimes})
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	return cb, nil
}

func open(ctx context.Context, kind supervisor.Kind, o supervisor.OpenOptions) (supervisor.Backend, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if kind == supervisor.KindAuto {
		ok, why := systemd.Probe(ctx)
		kind = supervisor.KindExec
		if ok {
			kind = supervisor.KindSystemd
		}
		log.Info("supervisor chosen", "supervisor", kind, "why", why)
	}
	switch kind {
	case supervisor.KindSystemd:
		b, err := systemd.New(ctx, systemd.Options{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("systemd supervisor: %w", err)
		}
		return b, nil
	case supervisor.KindExec:
		b, err := process.New(process.Options{StateDir: o.StateDir, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("exec supervisor: %w", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("supervisor %q: no such backend (want %q, %q or %q)", kind, supervisor.KindAuto, supervisor.KindSystemd, supervisor.KindExec)
}
