package container

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/napd/napd/supervisor"
)

// inUnits runs the systemd backend's containers: napd creates each itself
// (so that the runtime's refusals, a missing image first, come back to the
// wake), then starts the engine's transient unit, which starts the
// container and whose ExecStop= stops it. napd removes the container after
// the stop, and not before: a failed container's state and output stay
// readable.
type inUnits struct{ *Backend }

func active(st supervisor.Status) bool {
	return st.State == supervisor.ProcRunning || st.State == supervisor.ProcStarting
}

func (b inUnits) start(ctx context.Context, spec supervisor.Spec) error {
	c := b.clientOf(spec)
	st, err := b.inner.Status(ctx, spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.Model, err)
	}
	if active(st) {
		if r := b.record(spec.Model); r != nil && r.hash == specHash(spec) {
			return nil
		}
		if err := b.inner.Stop(ctx, spec); err != nil {
			return fmt.Errorf("start %s: stop the unit's old engine: %w", spec.Model, err)
		}
	}
	started := time.Now()
	f, err := b.create(ctx, c, spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.Model, err)
	}
	r := newRecord(c, spec.Model, f)
	r.hostPort, r.containerPort, r.stopTimeout, r.started = spec.Port, spec.Container.Port, spec.StopTimeout, started
	b.mu.Lock()
	b.records[spec.Model] = r
	b.mu.Unlock()
	u := b.unitSpec(spec, c, f)
	if err := b.inner.Start(ctx, u); err != nil {
		if why := b.failureDetail(c, spec.Model, spec.UnitName(), started); why != "" {
			err = fmt.Errorf("%w; %s", err, why)
		}
		b.forget(spec.Model, r)
		b.discard(c, spec.Model)
		return err
	}
	b.log.Info("engine container started in its unit", "model", spec.Model, "runtime", c.kind, "unit", spec.UnitName(), "id", short(r.id))
	return nil
}

// unitSpec is the transient unit that runs spec's container (created
// already, f): podman's `start` with the unit Type=forking on conmon,
// which --cgroups=split put in the unit; docker's `start --attach`, the
// client the unit's main process and the container its daemon's. Its
// environment is the runtime's part of napd's; the container's own was
// given at create.
func (b inUnits) unitSpec(spec supervisor.Spec, c client, f *inspected) supervisor.Spec {
	name := Name(spec.Model)
	timeout := spec.StopTimeout
	if timeout <= 0 {
		timeout = DefaultStopTimeout
	}
	u := supervisor.Spec{
		Model: spec.Model, Port: spec.Port, Health: spec.Health, Sleep: spec.Sleep,
		Environment: runtimeEnv(b.environ),
		StopCommand: c.stopLine(name, stopSeconds(spec)),
		StopTimeout: timeout + unitStopMargin,
	}
	if c.kind == Podman && f.ConmonPidFile != "" {
		u.Command, u.PIDFile = []string{c.program, "start", name}, f.ConmonPidFile
	} else {
		u.Command = []string{c.program, "start", "--attach", name}
	}
	return u
}

func (b inUnits) stop(ctx context.Context, spec supervisor.Spec) error {
	err := b.inner.Stop(ctx, spec)
	c := b.clientOf(spec)
	if r := b.record(spec.Model); r != nil {
		c = b.client(r.runtime, r.program)
		b.forget(spec.Model, r)
	}
	rmCtx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	f, ierr := c.inspectOne(rmCtx, Name(spec.Model))
	if ierr == nil && f != nil && f.model(b.st.Instance) == spec.Model {
		ierr = c.remove(rmCtx, f.ID)
	}
	if err != nil {
		return err
	}
	if ierr != nil {
		return fmt.Errorf("stop %s: %w", spec.Model, ierr)
	}
	return nil
}

// status is the unit's state, with the container's processes and
// memory while it runs. The container is inspected only while napd does
// not know its process (just started, or restarted): the planner asks for
// every model's status each round.
func (b inUnits) status(ctx context.Context, spec supervisor.Spec) (supervisor.Status, error) {
	st, err := b.inner.Status(ctx, spec)
	if err != nil || !active(st) {
		return st, err
	}
	r := b.record(spec.Model)
	if r == nil || r.pid == 0 || !b.procs.alive(r.pid) {
		f, err := b.clientOf(spec).inspectOne(ctx, Name(spec.Model))
		if err != nil || f == nil || f.model(b.st.Instance) != spec.Model || f.procState() != supervisor.ProcRunning {
			return st, nil // not started yet, or gone: the unit's processes are all there is
		}
		b.mu.Lock()
		if r == nil {
			r = newRecord(b.clientOf(spec), spec.Model, f)
			r.hostPort, r.containerPort, r.stopTimeout = spec.Port, spec.Container.Port, spec.StopTimeout
			b.records[spec.Model] = r
		}
		r.id, r.pid, r.conmonPid, r.ip = f.ID, f.State.Pid, f.State.ConmonPid, f.NetworkSettings.IPAddress
		b.mu.Unlock()
	}
	b.measure(r, &st)
	return st, nil
}

// unitFailure adds the container's account to a failed engine unit's
// reason.
func (b *Backend) unitFailure(model, reason string) string {
	r := b.record(model)
	if r == nil {
		return reason
	}
	b.mu.Lock()
	c, started := b.client(r.runtime, r.program), r.started
	b.mu.Unlock()
	if why := b.failureDetail(c, model, supervisor.UnitPrefix+model+".service", started); why != "" {
		return reason + "; " + why
	}
	return reason
}

// failureDetail is the runtime's own account of why the model's container
// ended or never started: its exit code or OOM kill, the error docker
// records in its state, and podman's error, which only its client prints
// (to the unit's journal).
func (b *Backend) failureDetail(c client, model, unit string, since time.Time) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var parts []string
	if f, err := c.inspectOne(ctx, Name(model)); err == nil && f != nil && f.procState() != supervisor.ProcRunning {
		parts = append(parts, "container "+f.exitReason())
	}
	if c.kind == Podman && !since.IsZero() {
		if e := journalErrors(ctx, unit, since); e != "" {
			parts = append(parts, e)
		}
	}
	return strings.Join(parts, "; ")
}

// journalErrors reads the error lines podman's client wrote to unit's
// journal since the start. Under Type=forking the client relays none of
// the container's output (conmon logs that), so its lines are its own.
// journald may store them a moment after the unit failed: it is asked a
// few times.
func journalErrors(ctx context.Context, unit string, since time.Time) string {
	for range 5 {
		out, err := exec.CommandContext(ctx, "journalctl", "--unit", unit,
			"--since", "@"+strconv.FormatInt(since.Unix(), 10), "--output", "cat", "--no-pager", "_COMM=podman").Output()
		if err != nil {
			return ""
		}
		var errs []string
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "Error: ") {
				errs = append(errs, l)
			}
		}
		if len(errs) > 0 {
			return message([]byte(strings.Join(errs, "\n")))
		}
		select {
		case <-ctx.Done():
			return ""
		case <-time.After(100 * time.Millisecond):
		}
	}
	return ""
}
