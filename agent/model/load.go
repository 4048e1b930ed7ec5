package model

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/supervisor"
)

// LoadMeter measures a waking engine's load (docs/lifecycle.md#load-progress).
// Its calls run off the loop.
type LoadMeter interface {
	// Weights is the size of the model's weight files in bytes, 0 when
	// napd does not know them.
	Weights(cfg *config.Model, spec supervisor.Spec) int64
	// Read is what each of the engine's processes has read so far; an
	// error when they cannot be read.
	Read(ctx context.Context, spec supervisor.Spec) (loadprogress.Counts, error)
}

// loadReadTimeout bounds one reading of a load's progress.
const loadReadTimeout = time.Second

// startLoad measures the load of wake op from now: the engine's
// processes' counts before it starts are the baseline. It runs on the
// wake's goroutine, before the supervisor starts the engine.
func (m *Model) startLoad(ctx context.Context, op lifecycle.Op, cfg *config.Model, spec supervisor.Spec) {
	if m.d.Load == nil {
		return
	}
	weights := m.d.Load.Weights(cfg, spec)
	rctx, cancel := context.WithTimeout(ctx, loadReadTimeout)
	base, _ := m.d.Load.Read(rctx, spec) // an engine not running has read nothing
	cancel()
	at := m.now()
	m.do(func() {
		if op == m.wakeOp && m.wakeStop != nil {
			learned := loadprogress.Learned{Wake: m.typical.Wake, Tail: m.tails.Typical()}
			m.load, m.loadSpec = loadprogress.Start(at, weights, learned, base), spec
			m.publish()
		}
	})
}

// loadTick takes a reading of the load in flight, one at a time.
func (m *Model) loadTick() {
	if m.load == nil || m.loadReading || m.machine.Snapshot().State != lifecycle.Waking {
		return
	}
	m.loadReading = true
	load, spec := m.load, m.loadSpec
	go func() {
		ctx, cancel := context.WithTimeout(m.d.Ctx, loadReadTimeout)
		defer cancel()
		counts, err := m.d.Load.Read(ctx, spec)
		at := m.now()
		m.do(func() { m.loadRead(load, at, counts, err == nil) })
	}()
}

// loadRead applies a reading of load; one of an attempt that ended is
// old news. A load that stalled for wake_stall_timeout fails its attempt.
func (m *Model) loadRead(load *loadprogress.Load, at time.Time, counts loadprogress.Counts, ok bool) {
	m.loadReading = false
	if load != m.load || m.machine.Snapshot().State != lifecycle.Waking {
		return
	}
	load.Observe(at, counts, ok)
	if load.Stalled(at, m.cfg.WakeStallTimeout) {
		m.loadStalled(load.Quiet(at))
		return
	}
	m.publish() // first: whoever the event wakes reads the new figure
	m.emit(control.Event{Kind: control.EventLoad, Load: load.Status().Wire()})
}

// loadStalled fails the wake in flight, whose load showed no progress for
// quiet: its engine is stopped (the attempt's goroutine does that once
// cancelled) and the attempt spent, as wake_timeout would, only sooner.
func (m *Model) loadStalled(quiet time.Duration) {
	why := fmt.Sprintf("load stalled: no progress for %s (wake_stall_timeout)", quiet.Round(time.Second))
	m.log.Warn("wake stalled", "why", why)
	op := m.wakeOp
	if m.wakeStop != nil {
		m.wakeStop()
		m.wakeStop = nil
	}
	m.load = nil
	m.apply(m.machine.WakeDone(m.now(), op, errors.New(why), m.evidence()), nil)
	m.publish()
}

// loadEnded ends the measure of the wake in flight, which made the engine
// serve at end when ok: its tail (last weight byte to serving) is learned.
func (m *Model) loadEnded(ok bool, end time.Time) {
	if m.load == nil {
		return
	}
	if tail, full := m.load.Tail(end); ok && full {
		m.tails.Add(tail)
	}
	m.load = nil
}

// loadStatus is the load's progress to publish: only while waking.
func (m *Model) loadStatus() *loadprogress.Status {
	if m.load == nil || m.machine.Snapshot().State != lifecycle.Waking {
		return nil
	}
	s := m.load.Status()
	return &s
}
