package model

import (
	"context"
	"fmt"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/probes/sockets"
)

// Progress is one reading of an engine's signs of work, compared between
// two health probes: its work counters (tokens, decode steps) when it
// publishes them, and what it sent on each connection to its port.
type Progress struct {
	Counters     float64
	HaveCounters bool
	Sent         map[sockets.Conn]uint64 // nil when the kernel does not say
}

// MovedSince reports whether the engine worked between prev and p, and
// whether the readings can tell at all: neither counters on both sides
// nor the kernel's byte counts (no netlink) means they cannot.
func (p Progress) MovedSince(prev Progress) (moved, known bool) {
	counters := p.HaveCounters && prev.HaveCounters
	if counters && p.Counters != prev.Counters {
		return true, true
	}
	return sockets.Moved(prev.Sent, p.Sent), counters || p.Sent != nil
}

// ProbeResult is one health probe of an awake engine, with a reading of
// its progress taken right after it.
type ProbeResult struct {
	Err      error // nil: healthy
	Progress Progress
	// Asleep: the engine reports it went to sleep by itself (llama.cpp's
	// idle sleep, sleep = "llamacpp").
	Asleep bool
}

// newWatch is the health watch of cfg's policy.
func newWatch(cfg *config.Model) *lifecycle.Watch {
	return lifecycle.NewWatch(cfg.HealthInterval, cfg.HealthFailures)
}

// watchTick probes an awake HTTP engine when its watch says so. The first
// tick that finds a (new) engine serving starts watching it.
func (m *Model) watchTick() {
	if m.d.Probe == nil || m.cfg.Transport != config.TransportHTTP || m.probing ||
		!m.machine.Snapshot().State.Serving() {
		return
	}
	now := m.now()
	if m.watched != m.eng {
		m.watched, m.progress = m.eng, Progress{}
		m.watch.Reset(now)
		return
	}
	if !m.watch.Due(now) {
		return
	}
	m.probing = true
	eng, cfg := m.eng, m.cfg
	ctx, cancel := context.WithTimeout(m.d.Ctx, m.watch.Timeout())
	go func() {
		defer cancel()
		r := m.d.Probe(ctx, eng.spec, cfg)
		m.do(func() { m.probed(eng, now, r) })
	}()
}

// probeNow probes the serving engine at once rather than at the next
// health_interval: a request could not connect to it in time. The watch's
// rules decide, so a swamped engine that shows progress keeps serving.
func (m *Model) probeNow() {
	now := m.now()
	if m.watched != m.eng {
		m.watched, m.progress = m.eng, Progress{}
		m.watch.Reset(now)
	}
	m.watch.Hasten(now)
	m.watchTick()
}

// probed applies a probe's result. A result about an engine that was
// replaced, or that no longer serves, is old news.
func (m *Model) probed(eng *instance, sent time.Time, r ProbeResult) {
	m.probing = false
	if eng != m.eng || eng != m.watched || !m.machine.Snapshot().State.Serving() {
		return
	}
	moved, known := r.Progress.MovedSince(m.progress)
	if !known && m.evidence().Active > 0 {
		// Requests in flight on an engine whose progress cannot be seen
		// may be a long generation: failures count once they ended.
		moved = true
	}
	m.progress = r.Progress
	if r.Err == nil && r.Asleep {
		m.engineSlept(true, "the engine went to sleep by itself (llama-server --sleep-idle-seconds)")
		m.publish()
		return
	}
	failed, hung := m.watch.Probed(sent, r.Err == nil, moved)
	switch {
	case r.Err == nil:
		return
	case !hung:
		m.log.Info("health probe failed", "err", r.Err, "progress", moved, "failed_in_a_row", failed, "of", m.cfg.HealthFailures)
		return
	}
	why := fmt.Sprintf("%d health probes failed with no progress (last: %v)", failed, r.Err)
	m.log.Warn("engine stopped answering", "why", why)
	m.stale = true // the next wake stops it first
	m.apply(m.machine.EngineHung(m.now(), why), nil)
	if m.machine.Snapshot().State == lifecycle.Unverified && len(m.queue) > 0 {
		m.apply(m.machine.Arrive(m.now()), nil) // queued requests are the next request
	}
	m.publish()
}
