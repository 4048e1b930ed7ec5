// Package container runs engines in containers, with podman or docker, as
// much napd's as a process engine: started, followed, stopped, adopted
// after a restart, measured. Backend wraps the supervisor backend napd
// chose: a spec with a Container runs as a container, every other spec
// goes to the wrapped backend unchanged.
//
// With the exec backend, napd creates and starts the container itself
// (detached) and follows it through `wait` and `container inspect`, never
// through a client process: the container is the runtime's (podman's
// conmon, docker's daemon), not napd's child. With the systemd backend the
// container runs inside the engine's transient unit: podman's conmon and
// container in sub-groups of the unit's cgroup (--cgroups=split, the unit
// Type=forking on conmon), docker's client attached as the unit's main
// process, and each unit's ExecStop= is the runtime's stop.
//
// It owns the containers labelled with its instance (napd.instance) and
// touches no other: at start it adopts the running ones that are still
// its engines and removes the rest. It must not build images, pull unless
// the spec says so, or handle registry credentials.
package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/napd/napd/supervisor"
)

// DefaultStopTimeout is the grace of a container's stop when its spec has
// no stop timeout.
const DefaultStopTimeout = 10 * time.Second

// unitStopMargin is what a unit's stop timeout adds to the container's
// grace: systemd's timeout covers ExecStop=, the runtime's own stop.
const unitStopMargin = 15 * time.Second

// Options configure a Backend.
type Options struct {
	// StateDir holds the instance file (containers.json).
	StateDir string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Runtimes are those the config names (runtime -> executable): at
	// start napd sweeps their containers as well as those of the runtimes
	// it used before.
	Runtimes map[string]string
	// Environ is the environment of the runtime clients napd runs; nil
	// means napd's own.
	Environ []string
}

// Backend runs the specs with a Container as containers and hands every
// other to the backend it wraps. It implements supervisor.Backend and the
// optional interfaces.
type Backend struct {
	inner     supervisor.Backend
	units     bool // inner runs systemd units: each container runs in one
	how       how  // detached or inUnits, as units says
	log       *slog.Logger
	procs     procs
	environ   []string
	statePath string

	events      chan supervisor.Event
	quit        chan struct{}
	forwardDone chan struct{}
	closeOnce   sync.Once
	closeErr    error
	waiters     sync.WaitGroup

	mu      sync.Mutex
	st      state
	records map[string]*record // by model: the containers napd runs or adopted
}

// record is one container of napd's. Fields are guarded by Backend.mu.
type record struct {
	model, runtime, program string
	id, hash                string
	pid, conmonPid          int
	ip                      string
	hostPort, containerPort int
	proxyPid                int // docker-proxy of a published port, once found
	stopTimeout             time.Duration
	started                 time.Time // when napd began to start it (zero when adopted)

	// Followed by a waiter (exec backend only): done is closed when the
	// container has ended, state and reason say how.
	done     chan struct{}
	stopping bool
	state    supervisor.ProcState
	reason   string
}

var _ supervisor.Backend = (*Backend)(nil)

// how is the way containers run under the wrapped backend: detached
// (exec) or in the engines' units (systemd).
type how interface {
	start(ctx context.Context, spec supervisor.Spec) error
	stop(ctx context.Context, spec supervisor.Spec) error
	status(ctx context.Context, spec supervisor.Spec) (supervisor.Status, error)
}

// The optional calls a Backend answers, for containers and by asking the
// wrapped backend.
var (
	_ supervisor.Adopter   = (*Backend)(nil)
	_ supervisor.Pruner    = (*Backend)(nil)
	_ supervisor.LogReader = (*Backend)(nil)
	_ supervisor.Uniter    = (*Backend)(nil)
)

// New wraps inner. Before it returns it sweeps the containers of this
// napd's instance: a running one that is a model's engine (and, under
// systemd, runs in the model's active unit) is kept for adoption, every
// other is removed. A runtime that cannot be asked is logged and skipped.
func New(ctx context.Context, inner supervisor.Backend, opts Options) (*Backend, error) {
	if opts.StateDir == "" {
		return nil, errors.New("container backend: no state directory")
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	environ := opts.Environ
	if environ == nil {
		environ = os.Environ()
	}
	path := filepath.Join(opts.StateDir, stateFile)
	st, err := loadState(path)
	if err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	_, units := inner.(supervisor.Uniter)
	b := &Backend{
		inner:       inner,
		units:       units,
		log:         log.With("backend", inner.Name()),
		environ:     environ,
		statePath:   path,
		events:      make(chan supervisor.Event, 64),
		quit:        make(chan struct{}),
		forwardDone: make(chan struct{}),
		st:          st,
		records:     make(map[string]*record),
	}
	b.how = detached{b}
	if units {
		b.how = inUnits{b}
	}
	runtimes := maps.Clone(st.Runtimes)
	maps.Copy(runtimes, opts.Runtimes)
	for _, kind := range slices.Sorted(maps.Keys(runtimes)) {
		b.sweep(ctx, b.client(kind, runtimes[kind]))
	}
	go b.forward()
	return b, nil
}

// Name is the wrapped backend's: "exec" or "systemd".
func (b *Backend) Name() string { return b.inner.Name() }

// Instance is the value of this napd's napd.instance labels.
func (b *Backend) Instance() string { return b.st.Instance }

func (b *Backend) client(kind, program string) client {
	return client{kind: kind, program: program, environ: b.environ}
}

func (b *Backend) clientOf(spec supervisor.Spec) client {
	return b.client(spec.Container.Runtime, spec.Container.Program)
}

func (b *Backend) record(model string) *record {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.records[model]
}

func (b *Backend) forget(model string, r *record) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.records[model] == r {
		delete(b.records, model)
	}
}

// sweep keeps the running containers of this instance that are models'
// engines and removes the others (stopped, half created, duplicates,
// orphans of a unit that is gone).
func (b *Backend) sweep(ctx context.Context, c client) {
	found, err := c.list(ctx, b.st.Instance)
	if err != nil {
		b.log.Warn("cannot list napd's containers; none is adopted or removed", "runtime", c.kind, "err", err)
		return
	}
	for i := range found {
		f := &found[i]
		model := f.model(b.st.Instance)
		keep := model != "" && f.Name == Name(model) && f.procState() == supervisor.ProcRunning && b.record(model) == nil
		if keep && b.units {
			st, err := b.inner.Status(ctx, supervisor.Spec{Model: model})
			keep = err == nil && (st.State == supervisor.ProcRunning || st.State == supervisor.ProcStarting)
		}
		if !keep {
			b.log.Info("removing a container a previous napd left", "model", model, "container", f.Name, "status", f.State.Status)
			if err := c.remove(ctx, f.ID); err != nil {
				b.log.Warn("removing a container a previous napd left", "container", f.Name, "err", err)
			}
			continue
		}
		r := newRecord(c, model, f)
		if !b.units {
			b.follow(c, r)
		}
		b.mu.Lock()
		b.records[model] = r
		b.mu.Unlock()
		b.log.Info("found the container of a previous napd", "model", model, "container", f.Name, "id", short(f.ID))
	}
}

func newRecord(c client, model string, f *inspected) *record {
	return &record{
		model: model, runtime: c.kind, program: c.program,
		id: f.ID, hash: f.Config.Labels[LabelSpec],
		pid: f.State.Pid, conmonPid: f.State.ConmonPid, ip: f.NetworkSettings.IPAddress,
		state: supervisor.ProcRunning,
	}
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// noteRuntime records that napd created a container with c, so that a
// later napd sweeps it even when its config names the runtime no more.
func (b *Backend) noteRuntime(c client) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st.Runtimes[c.kind] == c.program {
		return
	}
	b.st.Runtimes[c.kind] = c.program
	if err := saveState(b.statePath, b.st); err != nil {
		b.log.Warn("cannot record the container runtime", "runtime", c.kind, "err", err)
	}
}

// clear removes the container named for spec's model, if this napd
// created it; one it did not create is an error that names it.
func (b *Backend) clear(ctx context.Context, c client, model string) error {
	f, err := c.inspectOne(ctx, Name(model))
	if err != nil || f == nil {
		return err
	}
	if f.model(b.st.Instance) != model {
		owner := "that napd did not create"
		if inst := f.Config.Labels[LabelInstance]; inst != "" {
			owner = "of another napd (instance " + inst + ")"
		}
		return fmt.Errorf("a container named %s exists %s: remove it (%s rm %s) or rename the model", Name(model), owner, c.kind, Name(model))
	}
	b.log.Info("removing the model's old container", "model", model, "id", short(f.ID), "status", f.State.Status)
	return c.remove(ctx, f.ID)
}

// create creates spec's container and returns it inspected.
func (b *Backend) create(ctx context.Context, c client, spec supervisor.Spec) (*inspected, error) {
	if err := b.clear(ctx, c, spec.Model); err != nil {
		return nil, err
	}
	b.noteRuntime(c)
	if _, err := c.run(ctx, spec.Environment, createArgs(spec, b.st.Instance, b.units)...); err != nil {
		b.discard(c, spec.Model)
		return nil, err
	}
	f, err := c.inspectOne(ctx, Name(spec.Model))
	if err == nil && f == nil {
		err = errors.New("the container is gone right after its creation")
	}
	if err != nil {
		b.discard(c, spec.Model)
		return nil, err
	}
	return f, nil
}

// discard removes what a failed start left (docker keeps a container whose
// start failed), within its own bound.
func (b *Backend) discard(c client, model string) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := c.remove(ctx, Name(model)); err != nil {
		b.log.Warn("removing a container that did not start", "model", model, "err", err)
	}
}

// Start starts spec's engine: a container is created afresh (the model's
// old one removed) and started; one of spec's that runs already is left
// alone.
func (b *Backend) Start(ctx context.Context, spec supervisor.Spec) error {
	if spec.Container == nil {
		return b.inner.Start(ctx, spec)
	}
	return b.how.start(ctx, spec)
}

// Stop stops spec's engine and removes its container.
func (b *Backend) Stop(ctx context.Context, spec supervisor.Spec) error {
	if spec.Container == nil {
		return b.inner.Stop(ctx, spec)
	}
	return b.how.stop(ctx, spec)
}

// Status reports the engine's state; for a running container its
// processes (its cgroup's, conmon, docker-proxy) and the memory of its
// cgroup.
func (b *Backend) Status(ctx context.Context, spec supervisor.Spec) (supervisor.Status, error) {
	if spec.Container == nil {
		return b.inner.Status(ctx, spec)
	}
	return b.how.status(ctx, spec)
}

// measure fills st with r's processes and memory.
func (b *Backend) measure(r *record, st *supervisor.Status) {
	b.mu.Lock()
	c := *r
	b.mu.Unlock()
	pids, mem, ok := b.procs.of(&c)
	b.mu.Lock()
	r.proxyPid = c.proxyPid
	b.mu.Unlock()
	for _, p := range pids {
		if !slices.Contains(st.PIDs, p) {
			st.PIDs = append(st.PIDs, p)
		}
	}
	if ok {
		st.MemoryBytes, st.HaveMemory = mem, true
	}
}

// Adopt removes the container that runs for spec's model unless it was
// created from spec (its napd.spec label); under systemd also an engine
// unit that runs no container of spec's.
func (b *Backend) Adopt(ctx context.Context, spec supervisor.Spec) error {
	r := b.record(spec.Model)
	if r == nil && b.units && spec.Container != nil {
		found, err := b.unitContainer(ctx, spec)
		if err != nil {
			return err
		}
		r = found
	}
	if r == nil {
		return nil
	}
	b.mu.Lock()
	same := spec.Container != nil && r.runtime == spec.Container.Runtime && r.hash == specHash(spec)
	if same {
		r.hostPort, r.containerPort, r.stopTimeout = spec.Port, spec.Container.Port, spec.StopTimeout
	}
	b.mu.Unlock()
	if same {
		return nil
	}
	b.log.Info("removing the container of a previous config", "model", spec.Model, "id", short(r.id))
	old := supervisor.Spec{Model: spec.Model, StopTimeout: spec.StopTimeout,
		Container: &supervisor.Container{Runtime: r.runtime, Program: r.program}}
	return b.Stop(ctx, old)
}

// unitContainer finds, under systemd, the container of spec's model that
// runs in its active unit. A unit that runs none (its engine was no
// container, or another napd's) is stopped.
func (b *Backend) unitContainer(ctx context.Context, spec supervisor.Spec) (*record, error) {
	st, err := b.inner.Status(ctx, spec)
	if err != nil || (st.State != supervisor.ProcRunning && st.State != supervisor.ProcStarting) {
		return nil, err
	}
	c := b.clientOf(spec)
	f, err := c.inspectOne(ctx, Name(spec.Model))
	if err != nil {
		return nil, err
	}
	if f == nil || f.model(b.st.Instance) != spec.Model || f.procState() != supervisor.ProcRunning {
		b.log.Info("stopping an engine unit that runs no container of napd's", "model", spec.Model, "unit", st.Unit)
		return nil, b.inner.Stop(ctx, spec)
	}
	r := newRecord(c, spec.Model, f)
	b.mu.Lock()
	b.records[spec.Model] = r
	b.mu.Unlock()
	return r, nil
}

// Running lists the models whose engines run, sorted.
func (b *Backend) Running(ctx context.Context) ([]string, error) {
	models, err := b.inner.Running(ctx)
	b.mu.Lock()
	for m, r := range b.records {
		if r.state == supervisor.ProcRunning && !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	b.mu.Unlock()
	slices.Sort(models)
	return models, err
}

// StopUnknown stops the engines of models not in keep, the wrapped
// backend's (systemd units) and the containers napd runs or adopted, and
// returns those models, sorted.
func (b *Backend) StopUnknown(ctx context.Context, keep []string) ([]string, error) {
	var stopped []string
	var errs []error
	if p, ok := b.inner.(supervisor.Pruner); ok {
		s, err := p.StopUnknown(ctx, keep)
		stopped, errs = s, append(errs, err)
	}
	b.mu.Lock()
	var gone []*record
	for m, r := range b.records {
		if !slices.Contains(keep, m) {
			gone = append(gone, r)
		}
	}
	b.mu.Unlock()
	for _, r := range gone {
		b.log.Info("stopping the container of a model no longer configured", "model", r.model, "id", short(r.id))
		spec := supervisor.Spec{Model: r.model, Container: &supervisor.Container{Runtime: r.runtime, Program: r.program}}
		if err := b.Stop(ctx, spec); err != nil {
			errs = append(errs, err)
			continue
		}
		if !slices.Contains(stopped, r.model) {
			stopped = append(stopped, r.model)
		}
	}
	slices.Sort(stopped)
	return stopped, errors.Join(errs...)
}

// logsTimeout bounds how long napctl logs waits for the runtime.
const logsTimeout = 10 * time.Second

// Logs returns the last lines of the current container's output, as the
// runtime keeps it. Without a container, the wrapped backend answers (the
// journal, under systemd).
func (b *Backend) Logs(spec supervisor.Spec, lines int) ([]string, error) {
	if spec.Container != nil {
		ctx, cancel := context.WithTimeout(context.Background(), logsTimeout)
		defer cancel()
		out, err := b.clientOf(spec).logs(ctx, Name(spec.Model), lines)
		if !notFound(err) {
			return out, err
		}
		if !b.units {
			return nil, fmt.Errorf("model %s has no container now (asleep or never started)", spec.Model)
		}
	}
	if r, ok := b.inner.(supervisor.LogReader); ok {
		return r.Logs(spec, lines)
	}
	return nil, fmt.Errorf("the %s backend keeps no engine output", b.inner.Name())
}

// UnitName is the wrapped backend's (systemd: the engine's unit, which a
// container runs in), or "".
func (b *Backend) UnitName(spec supervisor.Spec) string {
	if u, ok := b.inner.(supervisor.Uniter); ok {
		return u.UnitName(spec)
	}
	return ""
}

// Events streams the wrapped backend's events and the containers'.
func (b *Backend) Events() <-chan supervisor.Event { return b.events }

// forward passes the wrapped backend's events on; under systemd a failed
// engine unit's reason gets the container's own account (its exit code, an
// OOM kill, the runtime's error).
func (b *Backend) forward() {
	defer close(b.forwardDone)
	for ev := range b.inner.Events() {
		if b.units && ev.State == supervisor.ProcFailed {
			ev.Reason = b.unitFailure(ev.Model, ev.Reason)
		}
		b.emit(ev)
	}
}

// emit delivers ev; only once the backend is closing and the buffer is
// full is it dropped.
func (b *Backend) emit(ev supervisor.Event) { supervisor.Send(b.events, b.quit, ev) }

// Close stops napd's containers under the exec backend (they end with
// napd, as its process engines do; under systemd they stay in their units
// for the next napd), closes the wrapped backend and the event stream.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		// First, so that nothing blocks on an event nobody reads.
		close(b.quit)
		if !b.units {
			detached{b}.stopAll()
		}
		b.waiters.Wait()
		b.closeErr = b.inner.Close()
		<-b.forwardDone
		close(b.events)
	})
	return b.closeErr
}
