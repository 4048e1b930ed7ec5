package measure

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/sockets"
	"github.com/napd/napd/supervisor"
)

// engineReading is what one measuring round found out about a serving
// engine beside napd's leases.
type engineReading struct {
	metrics enginemetrics.Evidence
	// peers are the clients connected to the engine's port that are not
	// napd; listening says whether a socket listens on that port at all
	// in napd's network namespace. tableErr: the socket table could not
	// be read (then neither is known).
	peers     []sockets.Peer
	listening bool
	tableErr  error
}

// activity is what the evidence the model's `evidence` key chooses says
// about the engine's work, with a detail for reasons: what it is busy
// with, or what is missing when it says nothing.
func activity(mode config.Evidence, port int, r engineReading) (planner.Engine, string) {
	useMetrics := mode == config.EvidenceMetrics || mode == config.EvidenceAuto && r.metrics.Have()
	switch {
	case mode == config.EvidenceLeases:
		return planner.EngineNone, `evidence = "leases": only napd's own requests are tracked`
	case useMetrics && r.metrics.Idle():
		return planner.EngineIdle, ""
	case useMetrics && r.metrics.Have():
		return planner.EngineBusy, fmt.Sprintf("the engine reports %d requests running and %d waiting", r.metrics.Running, r.metrics.Waiting)
	case useMetrics:
		return planner.EngineNone, "the engine publishes no activity metrics napd reads"
	case r.tableErr != nil:
		return planner.EngineNone, "the socket table cannot be read (" + r.tableErr.Error() + ")"
	case !r.listening:
		return planner.EngineNone, fmt.Sprintf("no socket listens on 127.0.0.1:%d in napd's network namespace, so its clients cannot be seen", port)
	case len(r.peers) > 0:
		return planner.EngineBusy, inUseOutside(r.peers)
	}
	return planner.EngineIdle, ""
}

// inUseOutside says who uses the engine without napd, e.g. "in use outside
// napd: 127.0.0.1:54012 (pid 4711, curl)".
func inUseOutside(peers []sockets.Peer) string {
	const shown = 3
	names := make([]string, 0, shown)
	for i, p := range peers {
		if i == shown {
			names = append(names, fmt.Sprintf("and %d more", len(peers)-shown))
			break
		}
		names = append(names, p.String())
	}
	return "in use outside napd: " + strings.Join(names, ", ")
}

// judgeEngines decides, for every serving model, what its evidence says of
// its engine: its own figures (scraped by Measure) and the connections to
// its port, from one reading of the socket table per round; and when it
// was last seen at work.
func (p *Prober) judgeEngines(ms *Measurement, snaps []model.Snapshot) {
	tab, tabErr := sockets.Reader{}.Read()
	for _, s := range snaps {
		mm, ok := ms.Models[s.Config.Name]
		if !ok || !s.Lifecycle.State.Serving() {
			p.active.forget(s.Config.Name)
			continue
		}
		r := engineReading{metrics: mm.Engine, tableErr: tabErr}
		port := s.Spec.Port
		if s.Config.Transport == config.TransportHTTP && tabErr == nil {
			r.listening = tab.Listening(port)
			var err error
			if r.peers, err = tab.Outside(port); err != nil {
				r.tableErr = err
			}
		}
		mm.Notes = notes(r)
		mm.Activity, mm.Detail = activity(s.Config.Evidence, port, r)
		if s.Config.Transport == config.TransportHTTP && s.Config.Evidence != config.EvidenceLeases {
			mm.ActiveAt = p.active.seen(s.Config.Name, ms.At, mm.Activity == planner.EngineBusy, mm.Engine)
		}
		ms.Models[s.Config.Name] = mm
	}
}

// lastActivity remembers, per serving model, its engine's work counters
// of the last round and when any evidence last showed the engine at work:
// busy by its own figures or by clients outside napd, or counters that
// moved since the last round (work done between two rounds, by a client
// that bypassed napd, that no single reading catches running).
type lastActivity struct {
	mu sync.Mutex
	by map[string]activitySeen
}

type activitySeen struct {
	progress     float64
	haveProgress bool
	at           time.Time // zero: not seen at work while napd watched
}

// seen records the round of at and returns when the engine was last seen
// at work (zero: not since it serves). Rounds may run at once and end in
// any order: the latest time wins.
func (l *lastActivity) seen(name string, at time.Time, busy bool, ev enginemetrics.Evidence) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = make(map[string]activitySeen)
	}
	prev := l.by[name]
	cur := prev
	moved := ev.HaveProgress && prev.haveProgress && ev.Progress != prev.progress
	if (busy || moved) && at.After(prev.at) {
		cur.at = at
	}
	if ev.HaveProgress {
		cur.progress, cur.haveProgress = ev.Progress, true
	}
	l.by[name] = cur
	return cur.at
}

// forget drops a model that does not serve: its next engine starts afresh
// (its wake counts as use on its own).
func (l *lastActivity) forget(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.by, name)
}

// notes says what status adds about a serving engine: who uses it without
// napd, and what Ollama holds and until when it keeps it by itself.
func notes(r engineReading) string {
	var out []string
	if len(r.peers) > 0 {
		out = append(out, inUseOutside(r.peers))
	}
	if r.metrics.Engine == enginemetrics.EngineOllama {
		held := "nothing"
		if len(r.metrics.Held) > 0 {
			var hs []string
			for _, h := range r.metrics.Held {
				hs = append(hs, fmt.Sprintf("%s until %s", h.Name, h.ExpiresAt.Format(time.RFC3339)))
			}
			held = strings.Join(hs, ", ")
		}
		out = append(out, "Ollama holds "+held)
	}
	return strings.Join(out, "; ")
}

// Reason is a model's reason in status and /v1/models: the lifecycle's,
// and the notes on a serving engine (ms may be nil: none measured yet).
func (ms *Measurement) Reason(name string, lc lifecycle.Snapshot) string {
	if ms == nil || !lc.State.Serving() {
		return lc.Reason
	}
	n := ms.Models[name].Notes
	switch {
	case n == "" || strings.Contains(lc.Reason, n):
		return lc.Reason
	case lc.Reason == "":
		return n
	}
	return lc.Reason + "; " + n
}

// ProbeEngine is a model's health probe of its awake engine (model.Deps
// Probe): one request to its health path and, beside it, its work counters
// when it publishes them; then what it sent on each connection to its
// port. An engine that sleeps by itself is asked whether it does.
func (p *Prober) ProbeEngine(ctx context.Context, spec supervisor.Spec, cfg *config.Model) model.ProbeResult {
	var r model.ProbeResult
	counters := make(chan enginemetrics.Evidence, 1)
	go func() {
		ev, _ := p.scrape(ctx, spec, cfg)
		counters <- ev
	}()
	r.Err = p.Supervisor.Probe(ctx, spec)
	if r.Err == nil {
		if asleep, err := p.Supervisor.SleepsByItself(ctx, spec); err == nil {
			r.Asleep = asleep
		}
	}
	if ev := <-counters; ev.HaveProgress {
		r.Progress.Counters, r.Progress.HaveCounters = ev.Progress, true
	}
	if tab, err := (sockets.Reader{}).Read(); err == nil {
		r.Progress.Sent = tab.Sent(spec.Port)
	}
	return r
}
