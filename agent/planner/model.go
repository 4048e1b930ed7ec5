// Package planner decides which models to put to sleep, and how models
// waiting to wake take turns for GPU memory (PlanRoom). It is pure: evidence (leases, engine metrics, memory
// figures, the time) goes in, decisions with their reasons and the figures
// they used come out. It owns no clock, socket or goroutine and logs
// nothing; the agent measures, calls it, logs each decision and acts.
package planner

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/sleepmode"
)

// Engine is what the engine's own metrics say about its work.
type Engine int

// Engine evidence.
const (
	// EngineNone: the engine publishes no request counts (or the scrape
	// failed), so idleness cannot be proven from it.
	EngineNone Engine = iota
	// EngineIdle: no running and no waiting request.
	EngineIdle
	// EngineBusy: requests running or waiting, perhaps from clients that
	// bypass napd.
	EngineBusy
)

func (e Engine) String() string {
	switch e {
	case EngineIdle:
		return "idle"
	case EngineBusy:
		return "busy"
	}
	return "none"
}

// Leases is the lease tracker's evidence for one model.
type Leases struct {
	// Active is the number of live leases (requests in flight or queued).
	Active int
	// IdleSince is when the last lease ended (or the model woke, if none
	// has been taken since). The zero time means unknown: the model is
	// never treated as idle long enough.
	IdleSince time.Time
}

// Model is one configured model as the planner sees it.
type Model struct {
	Name string
	// State is the model's lifecycle state. Only awake models are put to
	// sleep (an unsupported one is passed as awake: the lifecycle re-checks
	// the proof); draining ones are already going.
	State  lifecycle.State
	Pinned bool
	// Sleep is the sleep strategy (a sleepmode constant); sleepmode.None is the
	// same as Pinned.
	Sleep string
	GPUs  []int
	// Footprint is the model's GPU memory in bytes over all its GPUs
	// (gpu_memory, or the remembered measurement); 0 = unknown. It is
	// assumed to be spread evenly over GPUs (tensor parallelism).
	Footprint   int64
	IdleTimeout time.Duration // 0 = never put to sleep for idleness
	// IdleMinimum is the anti-flap guard: a model is no candidate for any
	// sleep until it has been idle this long.
	IdleMinimum time.Duration
	Leases      Leases
	Engine      Engine
	// AllowUntracked (allow_untracked_unload) lets EngineNone count as idle.
	AllowUntracked bool
	// LastUsed orders victims: least recently used first, after Recent.
	LastUsed time.Time
	// Serving is the highest priority class among the requests in flight
	// (None: none, or no classes); Recent the highest of its last busy
	// period: victims whose recent use was of the lowest class go first.
	Serving, Recent priority.Class
	// GPUBytes is the measured GPU memory of the model's processes per GPU
	// index; a GPU absent from the map was not measured.
	GPUBytes map[int]int64
	// HostBytes is the measured host memory of the engine (its cgroup);
	// 0 = not measured.
	HostBytes int64
	// YieldAfter is how long the model, busy, keeps admitting new requests
	// after another model started waiting for its memory (yield_after).
	YieldAfter time.Duration
	// Learned is what napd measured of the model's recent work.
	Learned Learned
	// KeepAwake: one of its keep_awake windows holds now, so it is not
	// put to sleep for idleness.
	KeepAwake bool
	// Slept is the strategy a sleeping model's engine sleeps with ("" =
	// unknown), since SleptAt; DeepSleep and DeepSleepAfter are its ladder.
	Slept          string
	SleptAt        time.Time
	DeepSleep      string
	DeepSleepAfter time.Duration
}

// Learned is the typical duration of a model's recent wakes and requests
// (0 = none measured yet), for Retry-After and timely yields.
type Learned struct {
	Wake    time.Duration
	Request time.Duration
}

// GPU is one device's memory. Devices that do not report memory are left
// out; the planner checks nothing on them.
type GPU struct {
	Index int
	Total int64
	Free  int64
	// Vendor and Alone shape the sets Place chooses among: an engine runs
	// on one vendor's GPUs, and on a MIG instance alone (CUDA gives a
	// process one MIG instance).
	Vendor string
	Alone  bool
}

// Host is the host's memory evidence.
type Host struct {
	MemAvailable int64
	HaveMem      bool
	PSISomeAvg10 float64
	HavePSI      bool
}

// Input is everything one planning round looks at.
type Input struct {
	Now      time.Time
	Models   []Model
	GPUs     []GPU
	Host     Host
	Pressure config.Pressure
	// GPUNote, when set, says that GPUs is not a fresh reading (the probe
	// failed) and what it is instead; a wake refusal carries it.
	GPUNote string
	// GPUUnknown means the probe failed and napd has no figure to check a
	// wake against: a model with a footprint and GPUs is refused rather
	// than woken blind.
	GPUUnknown bool
	// Classes are [policy] priorities (for messages; nil: no classes),
	// PriorityAge their starvation bound, and ClassYieldAfter how soon a
	// busy model serving only a class yields to a waiter of a higher one
	// (priority_yield_after; a class absent: the model's YieldAfter).
	Classes         priority.Classes
	PriorityAge     time.Duration
	ClassYieldAfter map[priority.Class]time.Duration
}

func (m *Model) pinned() bool { return m.Pinned || m.Sleep == sleepmode.None }

// idle reports proven idleness: no lease, and the engine agrees (or the
// operator allowed unloading without its word).
func (m *Model) idle() bool {
	if m.Leases.Active > 0 {
		return false
	}
	return m.Engine == EngineIdle || (m.Engine == EngineNone && m.AllowUntracked)
}

func (m *Model) idleFor(now time.Time) time.Duration {
	if m.Leases.IdleSince.IsZero() {
		return 0
	}
	return max(now.Sub(m.Leases.IdleSince), 0)
}

// evictable reports an awake model that may be put to sleep now for any
// reason: unpinned, proven idle, and idle for at least its minimum.
func (m *Model) evictable(now time.Time) bool {
	return m.State == lifecycle.Awake && !m.pinned() && m.idle() &&
		!m.Leases.IdleSince.IsZero() && m.idleFor(now) >= m.IdleMinimum
}

// gpuShare is what the model occupies on GPU g: the measurement when there
// is one, else its footprint's even share.
func (m *Model) gpuShare(g int) int64 {
	if b, ok := m.GPUBytes[g]; ok {
		return b
	}
	if m.Footprint > 0 && slices.Contains(m.GPUs, g) {
		return ceilDiv(m.Footprint, int64(len(m.GPUs)))
	}
	return 0
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// lru sorts models in eviction order: those whose recent use was of the
// lowest class first (no use counts lowest), then least recently used; the
// name breaks ties so that plans are deterministic.
func lru(ms []*Model) {
	slices.SortStableFunc(ms, func(a, b *Model) int {
		switch {
		case a.Recent.Above(b.Recent):
			return 1
		case b.Recent.Above(a.Recent):
			return -1
		}
		if c := a.LastUsed.Compare(b.LastUsed); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// gib formats bytes for messages.
func gib(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// Estimate stands in for a GPU probe that failed: each GPU's free memory
// becomes the lower of what in.GPUs says (the last reading, or the total
// when there is none recent: pass Free = Total) and the total less the
// footprint share of every model on it that is awake or draining; such
// models that were not measured are taken to hold their share. Memory of
// processes napd does not know is not counted beyond the reading. Waking
// models are left out: one waiting for room holds nothing yet, and PlanRoom
// reserves what one that is loading will take.
func (in *Input) Estimate() {
	for i := range in.Models {
		m := &in.Models[i]
		if m.State == lifecycle.Sleeping || m.State == lifecycle.Waking || m.Footprint <= 0 {
			continue
		}
		for _, g := range m.GPUs {
			if _, ok := m.GPUBytes[g]; !ok {
				if m.GPUBytes == nil {
					m.GPUBytes = make(map[int]int64)
				}
				m.GPUBytes[g] = ceilDiv(m.Footprint, int64(len(m.GPUs)))
			}
		}
	}
	for i := range in.GPUs {
		g := &in.GPUs[i]
		free := g.Total
		for _, m := range in.Models {
			if m.State != lifecycle.Sleeping && m.State != lifecycle.Waking {
				free -= m.GPUBytes[g.Index]
			}
		}
		g.Free = min(g.Free, free)
	}
}

// gpuOf finds a GPU by index.
func (in *Input) gpuOf(index int) (GPU, bool) {
	for _, g := range in.GPUs {
		if g.Index == index {
			return g, true
		}
	}
	return GPU{}, false
}

// hostPressed reports host memory or PSI pressure, under which a vllm-l1
// sleep would park weights in the RAM that is short.
func (in *Input) hostPressed() bool {
	return in.hostShortfall() > 0 || in.psiPressed()
}

func (in *Input) hostShortfall() int64 {
	if !in.Host.HaveMem {
		return 0
	}
	return in.Pressure.HostReserve - in.Host.MemAvailable
}

func (in *Input) psiPressed() bool {
	return in.Host.HavePSI && in.Host.PSISomeAvg10 > in.Pressure.PSISomeAvg10
}
