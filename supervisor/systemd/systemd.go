//go:build linux

// Package systemd is the supervisor.Backend that runs engines as systemd
// units over D-Bus: a model with a command runs as the transient unit
// napd-engine-<model>.service; a model with a unit controls that
// operator-owned unit. Job results are read from JobRemoved signals and unit
// state changes arrive as PropertiesChanged signals, never by polling.
//
// It must not touch units other than napd-engine-* and the operator units
// models name, and never polls systemd for state.
package systemd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/napd/napd/supervisor"
	"github.com/napd/napd/supervisor/internal/cgroup"
)

// Options configures New.
type Options struct {
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// CgroupRoot is where the cgroup filesystem is mounted; "" means
	// /sys/fs/cgroup. Unit PIDs are read from <root>[/unified|/systemd]<ControlGroup>/cgroup.procs.
	CgroupRoot string
}

// Backend runs engines as systemd units. It implements supervisor.Backend.
type Backend struct {
	log        *slog.Logger
	cgroupRoot string
	conn       *sdbus.Conn  // method calls
	sig        *godbus.Conn // signals only
	tr         *tracker
	events     chan supervisor.Event
	loopDone   chan struct{}
	closeOnce  sync.Once
}

var _ supervisor.Backend = (*Backend)(nil)

// JobError is a systemd job that did not finish "done", with the unit's own
// account of why.
type JobError struct {
	Op     string // "start" or "stop"
	Unit   string
	Result string // job result: failed, timeout, canceled, dependency, skipped
	Reason string // unit Result and ExecMainStatus, e.g. "exit-code (status=1)"
}

func (e *JobError) Error() string {
	msg := fmt.Sprintf("%s %s: job %s", e.Op, e.Unit, e.Result)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// New connects to the system bus twice (method calls; signals) and
// subscribes to systemd's signals.
func New(ctx context.Context, opts Options) (*Backend, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	root := opts.CgroupRoot
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	conn, err := sdbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("systemd: connect: %w", err)
	}
	sig, err := subscribe(ctx)
	if err != nil {
		conn.Close()
		return nil, err
	}
	b := &Backend{
		log:        log.With("backend", "systemd"),
		cgroupRoot: root,
		conn:       conn,
		sig:        sig,
		tr:         newTracker(),
		events:     make(chan supervisor.Event, 256),
		loopDone:   make(chan struct{}),
	}
	ch := make(chan *godbus.Signal, 256)
	sig.Signal(ch)
	go b.loop(ch)
	return b, nil
}

// subscribe opens the signal connection: JobRemoved and unit
// PropertiesChanged, then Manager.Subscribe so systemd emits them.
func subscribe(ctx context.Context) (*godbus.Conn, error) {
	sig, err := godbus.ConnectSystemBus(godbus.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("systemd: connect for signals: %w", err)
	}
	fail := func(what string, err error) (*godbus.Conn, error) {
		sig.Close()
		return nil, fmt.Errorf("systemd: %s: %w", what, err)
	}
	if err := sig.AddMatchSignalContext(ctx,
		godbus.WithMatchInterface("org.freedesktop.systemd1.Manager"),
		godbus.WithMatchMember("JobRemoved")); err != nil {
		return fail("match JobRemoved", err)
	}
	if err := sig.AddMatchSignalContext(ctx,
		godbus.WithMatchInterface("org.freedesktop.DBus.Properties"),
		godbus.WithMatchMember("PropertiesChanged"),
		godbus.WithMatchPathNamespace(unitPathNS)); err != nil {
		return fail("match PropertiesChanged", err)
	}
	obj := sig.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1")
	if err := obj.CallWithContext(ctx, "org.freedesktop.systemd1.Manager.Subscribe", 0).Err; err != nil {
		return fail("subscribe", err)
	}
	return sig, nil
}

// loop feeds signals to the tracker until the signal connection closes.
func (b *Backend) loop(ch <-chan *godbus.Signal) {
	defer close(b.loopDone)
	defer close(b.events)
	for sig := range ch {
		ev, ok := b.tr.handle(sig, time.Now())
		if !ok {
			continue
		}
		b.log.Info("engine unit changed", "model", ev.Model, "state", ev.State.String(), "reason", ev.Reason)
		select {
		case b.events <- ev:
		default:
			b.log.Warn("event dropped: nobody reads Events", "model", ev.Model, "state", ev.State.String())
		}
	}
}

// Name is "systemd".
func (b *Backend) Name() string { return string(supervisor.KindSystemd) }

// Events streams unit state changes of engines; closed by Close.
func (b *Backend) Events() <-chan supervisor.Event { return b.events }

// Close disconnects from D-Bus. Units keep running: they are siblings of
// napd's own unit, not children, and are adopted by the next Backend.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		b.conn.Close()
		_ = b.sig.Close()
		<-b.loopDone
	})
	return nil
}

// Start starts the engine's unit and returns once the start job is done.
// A transient unit already active is left alone.
func (b *Backend) Start(ctx context.Context, spec supervisor.Spec) error {
	unit := spec.UnitName()
	b.tr.watch(spec)
	if spec.Unit != "" || len(spec.Command) == 0 {
		return b.job(ctx, "start", unit, func() (int, error) {
			return b.conn.StartUnitContext(ctx, unit, "replace", nil)
		})
	}
	props, err := b.conn.GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		return fmt.Errorf("start %s: %w", unit, err)
	}
	switch props["ActiveState"] {
	case "active", "activating", "reloading":
		return nil
	}
	err = b.job(ctx, "start", unit, func() (int, error) {
		return b.conn.StartTransientUnitContext(ctx, unit, "replace", transientProperties(spec), nil)
	})
	var derr godbus.Error
	if errors.As(err, &derr) && derr.Name == "org.freedesktop.systemd1.UnitExists" {
		// Still loaded (e.g. stopping): start the existing unit instead.
		return b.job(ctx, "start", unit, func() (int, error) {
			return b.conn.StartUnitContext(ctx, unit, "replace", nil)
		})
	}
	return err
}

// Stop stops the engine's unit (systemd sends SIGTERM, SIGKILL after the
// unit's stop timeout) and returns once the stop job is done. A unit that
// is not loaded is already stopped.
func (b *Backend) Stop(ctx context.Context, spec supervisor.Spec) error {
	b.tr.watch(spec)
	return b.stopUnit(ctx, spec.UnitName())
}

func (b *Backend) stopUnit(ctx context.Context, unit string) error {
	err := b.job(ctx, "stop", unit, func() (int, error) {
		return b.conn.StopUnitContext(ctx, unit, "replace", nil)
	})
	var derr godbus.Error
	if errors.As(err, &derr) && derr.Name == "org.freedesktop.systemd1.NoSuchUnit" {
		return nil
	}
	return err
}

// job runs one job call and waits for its JobRemoved signal.
func (b *Backend) job(ctx context.Context, op, unit string, call func() (int, error)) error {
	b.tr.jobMu.Lock()
	id, err := call()
	if err != nil {
		b.tr.jobMu.Unlock()
		return fmt.Errorf("%s %s: %w", op, unit, err)
	}
	ch := make(chan jobResult, 1)
	b.tr.jobs[uint32(id)] = ch
	b.tr.jobMu.Unlock()

	select {
	case res := <-ch:
		if res.Result == "done" {
			b.log.Debug("job done", "op", op, "unit", unit)
			return nil
		}
		reason := res.Exit.String()
		if reason == "" {
			reason = b.exitInfo(ctx, unit).String()
		}
		return &JobError{Op: op, Unit: unit, Result: res.Result, Reason: reason}
	case <-ctx.Done():
		b.tr.jobMu.Lock()
		delete(b.tr.jobs, uint32(id))
		b.tr.jobMu.Unlock()
		return fmt.Errorf("%s %s: waiting for job %d: %w", op, unit, id, ctx.Err())
	}
}

// exitInfo reads a unit's exit information from systemd (zero when it is
// gone or not a service).
func (b *Backend) exitInfo(ctx context.Context, unit string) exitInfo {
	props, err := b.conn.GetUnitTypePropertiesContext(ctx, unit, "Service")
	if err != nil {
		return exitInfo{}
	}
	e := exitInfo{}
	e.Result, _ = props["Result"].(string)
	e.Code, _ = props["ExecMainCode"].(int32)
	e.Status, _ = props["ExecMainStatus"].(int32)
	return e
}

// Status reads the unit's state, its processes (from its cgroup) and its
// memory (MemoryCurrent).
func (b *Backend) Status(ctx context.Context, spec supervisor.Spec) (supervisor.Status, error) {
	unit := spec.UnitName()
	b.tr.watch(spec)
	st := supervisor.Status{State: supervisor.ProcUnknown, Unit: unit}
	uprops, err := b.conn.GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		return st, fmt.Errorf("status %s: %w", unit, err)
	}
	load, _ := uprops["LoadState"].(string)
	active, _ := uprops["ActiveState"].(string)
	st.State = procState(load, active)
	if load == "not-found" {
		return st, nil
	}
	sprops, err := b.conn.GetUnitTypePropertiesContext(ctx, unit, "Service")
	if err != nil {
		return st, fmt.Errorf("status %s: %w", unit, err)
	}
	if st.State == supervisor.ProcFailed {
		e := exitInfo{}
		e.Result, _ = sprops["Result"].(string)
		e.Code, _ = sprops["ExecMainCode"].(int32)
		e.Status, _ = sprops["ExecMainStatus"].(int32)
		st.Reason = e.String()
	}
	if mem, ok := sprops["MemoryCurrent"].(uint64); ok && mem != math.MaxUint64 {
		st.MemoryBytes, st.HaveMemory = int64(mem), true
	}
	cg, _ := sprops["ControlGroup"].(string)
	st.PIDs = cgroup.Reader{CgroupRoot: b.cgroupRoot}.Procs(cg)
	if main, ok := sprops["MainPID"].(uint32); ok && main > 0 && len(st.PIDs) == 0 {
		st.PIDs = []int{int(main)}
	}
	return st, nil
}

// Running lists the models of loaded napd-engine-* units (active, starting
// or failed), sorted.
func (b *Backend) Running(ctx context.Context) ([]string, error) {
	units, err := b.conn.ListUnitsByPatternsContext(ctx, nil, []string{supervisor.UnitPrefix + "*.service"})
	if err != nil {
		return nil, fmt.Errorf("list %s* units: %w", supervisor.UnitPrefix, err)
	}
	set := map[string]bool{}
	for _, u := range units {
		if m, ok := modelFromUnit(u.Name); ok && u.LoadState == "loaded" {
			set[m] = true
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// Logs implements supervisor.LogReader: napd keeps no copy of a unit's
// output; it says where it is.
func (b *Backend) Logs(spec supervisor.Spec, _ int) ([]string, error) {
	return nil, fmt.Errorf("the output of %s is in the journal: journalctl -u %s", spec.Model, spec.UnitName())
}

// UnitName implements supervisor.Uniter.
func (b *Backend) UnitName(spec supervisor.Spec) string { return spec.UnitName() }

// StopUnknown stops the napd-engine-* units of models not in keep (models
// removed from the config) and returns those models, sorted.
func (b *Backend) StopUnknown(ctx context.Context, keep []string) ([]string, error) {
	running, err := b.Running(ctx)
	if err != nil {
		return nil, err
	}
	var stopped []string
	var errs []error
	for _, m := range running {
		if slices.Contains(keep, m) {
			continue
		}
		unit := supervisor.UnitPrefix + m + ".service"
		b.log.Info("stopping engine unit of a model no longer configured", "model", m, "unit", unit)
		if err := b.stopUnit(ctx, unit); err != nil {
			errs = append(errs, err)
			continue
		}
		stopped = append(stopped, m)
	}
	return stopped, errors.Join(errs...)
}

// transientProperties are the properties of napd's transient unit for spec.
func transientProperties(spec supervisor.Spec) []sdbus.Property {
	env := map[string]string{}
	maps.Copy(env, spec.Environment)
	maps.Copy(env, spec.VisibleDevices())
	var envList []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envList = append(envList, k+"="+env[k])
	}
	prop := func(name string, v any) sdbus.Property {
		return sdbus.Property{Name: name, Value: godbus.MakeVariant(v)}
	}
	// exec: the start job fails when the command cannot be executed;
	// forking: when the command that starts the engine fails.
	typ := "exec"
	if spec.PIDFile != "" {
		typ = "forking"
	}
	props := []sdbus.Property{
		sdbus.PropDescription("napd engine for model " + spec.Model),
		// false: systemd reads this flag as "ignore failure" (the "-"
		// prefix), whatever go-systemd calls it; an engine's exit status counts.
		sdbus.PropExecStart(spec.Command, false),
		sdbus.PropType(typ),
		prop("KillMode", "mixed"),
		// A failed transient unit is collected at once, so the next Start
		// can create it again.
		prop("CollectMode", "inactive-or-failed"),
		prop("MemoryAccounting", true),
		prop("StandardOutput", "journal"),
		prop("StandardError", "journal"),
		prop("SyslogIdentifier", supervisor.UnitPrefix+spec.Model),
	}
	if len(envList) > 0 {
		props = append(props, prop("Environment", envList))
	}
	if spec.WorkingDirectory != "" {
		props = append(props, prop("WorkingDirectory", spec.WorkingDirectory))
	}
	if spec.User != "" {
		props = append(props, prop("User", spec.User))
	}
	if spec.StopTimeout > 0 {
		props = append(props, prop("TimeoutStopUSec", uint64(spec.StopTimeout/time.Microsecond)))
	}
	if spec.PIDFile != "" {
		props = append(props, prop("PIDFile", spec.PIDFile))
	}
	if len(spec.StopCommand) > 0 {
		// ExecStop= has ExecStart='s shape; its failure (the engine gone
		// already) is ignored: systemd stops what is left either way.
		stop := sdbus.PropExecStart(spec.StopCommand, true)
		stop.Name = "ExecStop"
		props = append(props, stop)
	}
	return props
}

// The systemd backend's optional calls.
var (
	_ supervisor.LogReader = (*Backend)(nil)
	_ supervisor.Uniter    = (*Backend)(nil)
	_ supervisor.Pruner    = (*Backend)(nil)
)
