package container

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/napd/napd/supervisor"
)

// detached runs the exec backend's containers: napd creates and starts
// each itself, detached, and a waiter (`wait`, then `container inspect`)
// tells when it ends and how.
type detached struct{ *Backend }

// waitRetry is the pause before a waiter asks again, when its `wait` ended
// but the container still runs (the client was killed, the runtime
// restarted): the runtime is asked once more, not in a tight loop.
const waitRetry = time.Second

func (b detached) start(ctx context.Context, spec supervisor.Spec) error {
	c := b.clientOf(spec)
	if r := b.record(spec.Model); r != nil {
		b.mu.Lock()
		running := r.state == supervisor.ProcRunning && r.hash == specHash(spec)
		b.mu.Unlock()
		if running {
			return nil
		}
		if err := b.stop(ctx, spec); err != nil {
			return fmt.Errorf("start %s: %w", spec.Model, err)
		}
	}
	if _, err := b.create(ctx, c, spec); err != nil {
		return fmt.Errorf("start %s: %w", spec.Model, err)
	}
	if _, err := c.run(ctx, nil, "start", Name(spec.Model)); err != nil {
		b.discard(c, spec.Model)
		return fmt.Errorf("start %s: %w", spec.Model, err)
	}
	f, err := c.inspectOne(ctx, Name(spec.Model))
	if err != nil || f == nil {
		b.discard(c, spec.Model)
		return fmt.Errorf("start %s: the container vanished after its start (%v)", spec.Model, err)
	}
	r := newRecord(c, spec.Model, f)
	r.hostPort, r.containerPort, r.stopTimeout = spec.Port, spec.Container.Port, spec.StopTimeout
	b.follow(c, r)
	b.mu.Lock()
	b.records[spec.Model] = r
	b.mu.Unlock()
	b.log.Info("engine container started", "model", spec.Model, "runtime", c.kind, "id", short(r.id), "pid", r.pid)
	b.emit(supervisor.Event{Model: spec.Model, State: supervisor.ProcRunning, Reason: "container started", Time: time.Now()})
	return nil
}

// follow starts r's waiter.
func (b *Backend) follow(c client, r *record) {
	r.done = make(chan struct{})
	b.waiters.Add(1)
	go b.wait(c, r)
}

// wait waits for r's container to end, then records and reports how.
func (b *Backend) wait(c client, r *record) {
	defer b.waiters.Done()
	var f *inspected
	var err error
	for {
		began := time.Now()
		// No context: the container's end (its stop at napd's Close
		// included) ends the command, napd's death kills it.
		_ = c.command(context.Background(), nil, "wait", r.id).Run()
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		f, err = c.inspectOne(ctx, r.id)
		cancel()
		if err != nil || f == nil || f.procState() != supervisor.ProcRunning {
			break
		}
		if d := waitRetry - time.Since(began); d > 0 {
			time.Sleep(d)
		}
	}
	at := time.Now()
	reason := "the container was removed"
	switch {
	case f != nil:
		reason = f.exitReason()
	case err != nil:
		reason = "cannot inspect the container: " + err.Error()
	}
	b.mu.Lock()
	state := supervisor.ProcFailed
	if r.stopping {
		state = supervisor.ProcStopped
	}
	r.state, r.reason = state, reason
	b.mu.Unlock()
	close(r.done)
	if state == supervisor.ProcFailed {
		b.log.Warn("engine container exited", "model", r.model, "id", short(r.id), "status", reason)
	} else {
		b.log.Info("engine container stopped", "model", r.model, "id", short(r.id), "status", reason)
	}
	b.emit(supervisor.Event{Model: r.model, State: state, Reason: reason, Time: at})
}

// stop stops the model's container (its stop signal, SIGKILL after
// the grace; at once when ctx ends), waits until its waiter saw it end, and
// removes it.
func (b detached) stop(ctx context.Context, spec supervisor.Spec) error {
	r := b.record(spec.Model)
	if r == nil {
		return nil
	}
	c := b.client(r.runtime, r.program)
	b.mu.Lock()
	running := r.state == supervisor.ProcRunning
	r.stopping = true
	if spec.StopTimeout <= 0 {
		spec.StopTimeout = r.stopTimeout
	}
	b.mu.Unlock()
	if running {
		if err := c.stop(ctx, r.id, stopSeconds(spec)); err != nil {
			b.log.Warn("container stop failed, removing it by force", "model", spec.Model, "err", err)
		} else {
			// Its waiter reads the exit code before the container is gone.
			select {
			case <-r.done:
			case <-ctx.Done():
			}
		}
	}
	// The removal kills what the stop left (or did not reach).
	rmCtx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	err := c.remove(rmCtx, r.id)
	select {
	case <-r.done:
	case <-rmCtx.Done():
		return fmt.Errorf("stop %s: container %s did not end", spec.Model, short(r.id))
	}
	b.forget(spec.Model, r)
	if err != nil {
		return fmt.Errorf("stop %s: %w", spec.Model, err)
	}
	return nil
}

func (b detached) status(_ context.Context, spec supervisor.Spec) (supervisor.Status, error) {
	r := b.record(spec.Model)
	if r == nil {
		return supervisor.Status{State: supervisor.ProcStopped}, nil
	}
	b.mu.Lock()
	st := supervisor.Status{State: r.state, Reason: r.reason}
	b.mu.Unlock()
	if st.State == supervisor.ProcRunning {
		st.Reason = "container " + short(r.id)
		b.measure(r, &st)
	}
	return st, nil
}

// stopAll stops every container at napd's Close, at once.
func (b detached) stopAll() {
	b.mu.Lock()
	var running []*record
	for _, r := range b.records {
		running = append(running, r)
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range running {
		wg.Go(func() {
			spec := supervisor.Spec{Model: r.model, Container: &supervisor.Container{Runtime: r.runtime, Program: r.program}}
			ctx, cancel := context.WithTimeout(context.Background(), max(r.stopTimeout, DefaultStopTimeout)+callTimeout)
			defer cancel()
			if err := b.stop(ctx, spec); err != nil {
				b.log.Warn("stopping engine container", "model", r.model, "err", err)
			}
		})
	}
	wg.Wait()
}
