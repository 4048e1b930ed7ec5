package model

import (
	"fmt"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/sleepmode"
)

// An engine that sleeps by itself (sleep = "llamacpp": llama-server
// --sleep-idle-seconds) frees its GPU memory without napd asking and
// takes it back on its next request. napd follows it: once its health
// probe says the engine sleeps, or once the engine has had no request for
// its own idle time when a request arrives, the model is asleep, so its
// memory counts as free room and the next request goes through the fit
// check and a wake (an empty tokenize, which reloads the model) like any
// other.

// selfSleepMargin is how much before its own idle sleep is due napd takes
// an engine for asleep: its idle clock starts at the end of its last task,
// a moment before napd's lease of that request ends.
func selfSleepMargin(d time.Duration) time.Duration { return min(d/10, time.Second) }

// mayHaveSlept reports, on an arrival, a serving engine that sleeps by
// itself and has had no request for about its own idle time: it may be
// asleep. The request then waits for a wake, which finds the engine awake
// if it still is (and the memory it holds still its own).
func (m *Model) mayHaveSlept(now time.Time) bool {
	d := m.cfg.SelfSleep
	if d <= 0 || m.active > 0 {
		return false
	}
	lc := m.machine.Snapshot()
	if !lc.State.Serving() {
		return false
	}
	return now.Sub(later(m.lastUsed, lc.AwakeSince)) >= d-selfSleepMargin(d)
}

// engineSlept handles an engine that went to sleep by itself (seen: its
// probe said so) or that may have (an arrival after its idle time): the
// model is asleep, or wakes at once for the leases waiting. Not while a
// request is under way on it: an engine at work does not sleep, and its
// requests keep it awake.
func (m *Model) engineSlept(seen bool, why string) {
	if m.active > 0 || !m.machine.Snapshot().State.Serving() {
		return
	}
	now := m.now()
	m.slept = sleepmode.LlamaCpp
	m.eng.retire() // the next wake makes a new instance
	if seen {
		m.freed = now
		m.d.Metrics.Sleeps.WithLabelValues(m.name, "engine").Inc()
		m.emit(control.Event{Kind: control.EventSleep, Reason: why + ", strategy " + sleepmode.LlamaCpp})
	}
	m.apply(m.machine.EngineSlept(now, why, m.evidence()), nil)
}

// selfSleepArrival is an arrival's check of an engine that sleeps by
// itself (see mayHaveSlept).
func (m *Model) selfSleepArrival(now time.Time) {
	if m.mayHaveSlept(now) {
		m.engineSlept(false, fmt.Sprintf("no request for %s, its own idle sleep (%s): it may be asleep",
			now.Sub(later(m.lastUsed, m.machine.Snapshot().AwakeSince)).Round(time.Second), m.cfg.SelfSleep))
	}
}
