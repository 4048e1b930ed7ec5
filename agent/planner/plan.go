package planner

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/sleepmode"
)

// Action is what to do with a model.
type Action string

// Actions.
const (
	// ActionSleep: put the model to sleep with Decision.Strategy.
	ActionSleep Action = "sleep"
	// ActionStop: stop the engine instead of its own strategy (a vllm-l1
	// model under host pressure: level 1 parks weights in host RAM).
	ActionStop Action = "stop"
)

// Reason is why a decision was taken.
type Reason string

// Reasons.
const (
	ReasonIdle         Reason = "idle"
	ReasonGPUPressure  Reason = "gpu-pressure"
	ReasonHostPressure Reason = "host-pressure"
	ReasonPSIPressure  Reason = "psi-pressure"
	ReasonMakeRoom     Reason = "make-room"
	// ReasonYield: a busy holder stops admitting and sleeps once its
	// requests end, because another model waited yield_after for its
	// memory.
	ReasonYield Reason = "yield"
	// ReasonDeepSleep: a model asleep in a light strategy is stopped after
	// deep_sleep_after (the sleep ladder).
	ReasonDeepSleep Reason = "deep-sleep"
)

// Decision is one model to put to sleep, why, and the figures behind it.
type Decision struct {
	Model  string
	Action Action
	// Strategy is the sleep strategy to apply: the model's own for
	// ActionSleep, sleepmode.Stop for ActionStop.
	Strategy string
	Reason   Reason
	// Message says it for a human, with the figures.
	Message string
	// IdleFor is how long the model had been idle.
	IdleFor time.Duration
	// FreesGPU is the projected GPU memory freed per GPU index.
	FreesGPU map[int]int64
	// FreesHost is the projected host memory freed (stops only).
	FreesHost int64
}

// LogValue makes a Decision log as one group of structured fields.
func (d Decision) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("model", d.Model),
		slog.String("action", string(d.Action)),
		slog.String("strategy", d.Strategy),
		slog.String("reason", string(d.Reason)),
		slog.Duration("idle_for", d.IdleFor),
	}
	for _, g := range slices.Sorted(maps.Keys(d.FreesGPU)) {
		attrs = append(attrs, slog.Int64(fmt.Sprintf("frees_gpu%d_bytes", g), d.FreesGPU[g]))
	}
	if d.FreesHost > 0 {
		attrs = append(attrs, slog.Int64("frees_host_bytes", d.FreesHost))
	}
	attrs = append(attrs, slog.String("message", d.Message))
	return slog.GroupValue(attrs...)
}

// Result is one planning round's outcome.
type Result struct {
	Decisions []Decision
	// Unrelieved describes pressure that remains after the decisions
	// because no idle, unpinned model could relieve it.
	Unrelieved []string
	// Unproven names the awake, unpinned models past their idle_timeout
	// with no lease whose engine gives no evidence (EngineNone, without
	// allow_untracked_unload): they would sleep if their idleness could be
	// proven. The lifecycle marks them unsupported, saying what is missing.
	Unproven []string
}

// Plan decides which models to put to sleep now:
//   - an evictable model idle past its idle_timeout sleeps (ReasonIdle);
//   - a GPU whose free memory is below gpu_reserve gets idle models on it put
//     to sleep, least recently used first, until the projected relief
//     covers the shortfall (ReasonGPUPressure);
//   - MemAvailable below host_reserve does the same with the host memory
//     the engines' cgroups hold (ReasonHostPressure); memory PSI above
//     psi_some_avg10 alone puts one model to sleep per round, as its relief
//     cannot be projected (ReasonPSIPressure).
//
// Under host or PSI pressure a vllm-l1 model is stopped instead, and a
// vllm-l1 model already asleep, holding its weights in host RAM, is stopped.
// A model with a live lease, a pinned one and one idle for less than its
// minimum are never chosen; each model gets at most one decision.
func Plan(in Input) Result {
	p := newPlanner(&in)
	p.idle()
	for _, g := range slices.SortedFunc(slices.Values(in.GPUs), func(a, b GPU) int { return a.Index - b.Index }) {
		p.gpuPressure(g)
	}
	p.hostPressure()
	p.deepSleep()
	return Result{Decisions: p.decisions, Unrelieved: p.unrelieved, Unproven: p.unproven}
}

type planner struct {
	in         *Input
	byLRU      []*Model // every model, least recently used first
	chosen     map[string]bool
	decisions  []Decision
	unrelieved []string
	unproven   []string
}

func newPlanner(in *Input) *planner {
	p := &planner{in: in, chosen: make(map[string]bool)}
	for i := range in.Models {
		p.byLRU = append(p.byLRU, &in.Models[i])
	}
	lru(p.byLRU)
	return p
}

// decide records a decision for m, stopping instead of a vllm-l1 sleep
// when the host is short of memory. A llama-server cannot be asked to
// sleep by itself: napd's sleep of one is a stop.
func (p *planner) decide(m *Model, reason Reason, why string) Decision {
	d := Decision{Model: m.Name, Action: ActionSleep, Strategy: m.Sleep, Reason: reason, IdleFor: m.idleFor(p.in.Now)}
	if m.Sleep == sleepmode.VLLML1 && (m.State != lifecycle.Awake || p.in.hostPressed()) {
		d.Action, d.Strategy = ActionStop, sleepmode.Stop
	}
	if m.Sleep == sleepmode.LlamaCpp {
		d.Action, d.Strategy = ActionStop, sleepmode.Stop
	}
	if m.State == lifecycle.Awake {
		d.FreesGPU = make(map[int]int64)
		for _, g := range m.GPUs {
			if b := m.gpuShare(g); b > 0 {
				d.FreesGPU[g] = b
			}
		}
	}
	if d.Strategy == sleepmode.Stop {
		d.FreesHost = m.HostBytes
	}
	verb := "sleep " + m.Name + " (" + m.Sleep + ")"
	switch {
	case m.Sleep == sleepmode.LlamaCpp:
		verb = "stop " + m.Name + " (llama-server sleeps by itself only when idle: napd stops it)"
	case d.Action == ActionStop:
		verb = "stop " + m.Name + " instead of " + m.Sleep + " sleep (host memory is short)"
	}
	d.Message = fmt.Sprintf("%s: %s; idle %s", verb, why, d.IdleFor.Round(time.Second))
	if m.Leases.Active > 0 {
		d.IdleFor = 0
		d.Message = fmt.Sprintf("%s: %s; %d in flight", verb, why, m.Leases.Active)
	}
	p.chosen[m.Name] = true
	p.decisions = append(p.decisions, d)
	return d
}

func (p *planner) idle() {
	now := p.in.Now
	for _, m := range p.byLRU {
		if m.KeepAwake || m.IdleTimeout <= 0 || m.idleFor(now) < m.IdleTimeout || m.Leases.IdleSince.IsZero() ||
			m.Sleep == sleepmode.LlamaCpp { // its idle sleep is the engine's own
			continue
		}
		switch {
		case m.evictable(now):
			p.decide(m, ReasonIdle, "idle_timeout "+m.IdleTimeout.String()+" passed")
		case m.State == lifecycle.Awake && !m.pinned() && m.Leases.Active == 0 && m.Engine == EngineNone && !m.AllowUntracked:
			p.unproven = append(p.unproven, m.Name)
		}
	}
}

// gpuFreed is the memory on GPU g already coming back: decisions of this
// round and models still draining from an earlier one.
func (p *planner) gpuFreed(g int) int64 {
	var freed int64
	for _, d := range p.decisions {
		freed += d.FreesGPU[g]
	}
	for _, m := range p.byLRU {
		if m.State == lifecycle.Draining && !p.chosen[m.Name] {
			freed += m.gpuShare(g)
		}
	}
	return freed
}

func (p *planner) gpuPressure(g GPU) {
	reserve := p.in.Pressure.GPUReserve
	short := reserve - g.Free - p.gpuFreed(g.Index)
	if short <= 0 {
		return
	}
	why := fmt.Sprintf("GPU %d has %s free, below gpu_reserve %s", g.Index, gib(g.Free), gib(reserve))
	for _, m := range p.byLRU {
		if short <= 0 {
			return
		}
		if p.chosen[m.Name] || !m.evictable(p.in.Now) || m.gpuShare(g.Index) <= 0 {
			continue
		}
		d := p.decide(m, ReasonGPUPressure, fmt.Sprintf("%s; frees ~%s there", why, gib(m.gpuShare(g.Index))))
		short -= d.FreesGPU[g.Index]
	}
	if short > 0 {
		p.unrelieved = append(p.unrelieved, fmt.Sprintf("%s; %s still short with no idle, unpinned model to put to sleep", why, gib(short)))
	}
}

// hostCandidate reports a model whose stop would free host memory: an
// evictable model that would be stopped, or a vllm-l1 model asleep with
// its weights in host RAM.
func (p *planner) hostCandidate(m *Model) bool {
	if p.chosen[m.Name] || m.HostBytes <= 0 || m.pinned() {
		return false
	}
	switch m.State {
	case lifecycle.Awake:
		return m.evictable(p.in.Now) && (m.Sleep == sleepmode.Stop || m.Sleep == sleepmode.VLLML1 || m.Sleep == sleepmode.LlamaCpp)
	case lifecycle.Sleeping:
		// Asleep with its process and its host memory kept.
		kept := m.Sleep == sleepmode.VLLML1 || m.Slept == sleepmode.LlamaCpp
		return kept && m.Leases.Active == 0 &&
			!m.Leases.IdleSince.IsZero() && m.idleFor(p.in.Now) >= m.IdleMinimum
	}
	return false
}

// deepSleep moves a model asleep in a light strategy (its engine process
// stays) down the ladder: stopped once it has slept deep_sleep_after.
func (p *planner) deepSleep() {
	for _, m := range p.byLRU {
		light := m.Slept == sleepmode.VLLML1 || m.Slept == sleepmode.VLLML2 || m.Slept == sleepmode.SGLang || m.Slept == sleepmode.LlamaCpp
		if m.State != lifecycle.Sleeping || !light || m.DeepSleep != sleepmode.Stop || p.chosen[m.Name] ||
			m.Leases.Active > 0 || m.SleptAt.IsZero() || p.in.Now.Sub(m.SleptAt) < m.DeepSleepAfter {
			continue
		}
		why := fmt.Sprintf("asleep (%s) for %s, deep_sleep_after %s", m.Slept, p.in.Now.Sub(m.SleptAt).Round(time.Second), m.DeepSleepAfter)
		p.decide(m, ReasonDeepSleep, why)
		d := &p.decisions[len(p.decisions)-1]
		d.Action, d.Strategy, d.FreesHost = ActionStop, sleepmode.Stop, m.HostBytes
		d.Message = "stop " + m.Name + ": " + why
	}
}

func (p *planner) hostPressure() {
	in := p.in
	short := in.hostShortfall()
	if short > 0 {
		for _, d := range p.decisions {
			short -= d.FreesHost
		}
		why := fmt.Sprintf("MemAvailable %s is below host_reserve %s", gib(in.Host.MemAvailable), gib(in.Pressure.HostReserve))
		for _, m := range p.byLRU {
			if short <= 0 {
				return
			}
			if p.hostCandidate(m) {
				short -= p.decide(m, ReasonHostPressure, fmt.Sprintf("%s; frees ~%s of host memory", why, gib(m.HostBytes))).FreesHost
			}
		}
		if short > 0 {
			p.unrelieved = append(p.unrelieved, fmt.Sprintf("%s; %s still short with no idle engine to stop", why, gib(short)))
		}
		return
	}
	if !in.psiPressed() {
		return
	}
	why := fmt.Sprintf("memory PSI some avg10 %.2f is above psi_some_avg10 %.2f", in.Host.PSISomeAvg10, in.Pressure.PSISomeAvg10)
	for _, d := range p.decisions {
		if d.FreesHost > 0 {
			return // this round already frees host memory; measure again next round
		}
	}
	for _, m := range p.byLRU {
		if p.hostCandidate(m) {
			p.decide(m, ReasonPSIPressure, fmt.Sprintf("%s; frees ~%s of host memory", why, gib(m.HostBytes)))
			return
		}
	}
	p.unrelieved = append(p.unrelieved, why+"; no idle engine to stop")
}
