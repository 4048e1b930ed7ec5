// Package demoengine emulates a vLLM OpenAI-compatible server closely enough
// that napd can be developed, demonstrated and tested without a GPU: health
// while loading, completions with paced tokens, vLLM's sleep-mode endpoints
// (and SGLang's memory-occupation ones), Prometheus metrics, resident
// "weights" memory and scripted failures. cmd/napd-demo-engine wraps it.
//
// It is for tests and demos only: napd must not import it.
package demoengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"
)

// Memory tags of vLLM's sleep mode (also SGLang's).
const (
	tagWeights = "weights"
	tagKVCache = "kv_cache"
)

var (
	errAsleep   = errors.New("the model is sleeping; wake it up first")
	errStale    = errors.New("the weights were discarded by a level-2 sleep and not reloaded (collective_rpc reload_weights)")
	errAborted  = errors.New("the request was aborted because the engine was put to sleep")
	errSleeping = errors.New("another sleep is in progress")
	errBusy     = errors.New("requests are running; drain them before releasing memory")
)

// Engine is one emulated inference server. Its state is guarded by one
// mutex; completions run in their handlers' goroutines and register as jobs
// so that a sleep can abort or wait for them.
type Engine struct {
	opts    Options
	log     *slog.Logger
	exit    func(int)
	started time.Time
	slots   chan struct{} // one token per running completion (MaxNumSeqs)

	mu        sync.Mutex
	asleep    map[string]bool // memory tags currently asleep
	level     int             // level of the current sleep; 0 when awake
	closing   bool            // a sleep is draining: admit nothing new
	stale     bool            // level-2 weights re-allocated, not yet reloaded
	weights   []byte
	jobs      map[*job]struct{}
	running   int
	waiting   int
	idle      chan struct{} // closed when the last job ends
	admitted  int           // completions admitted so far (for CrashAfter)
	generated int           // tokens generated so far
	lastEnd   time.Time     // when the last completion ended (Ollama's keep-alive)
	ids       uint64
	stats     Stats
	control   []ControlRequest
	selfSleep idleSleep // llama.cpp's own idle sleep (SleepIdle)
	load      loadState // reading LoadFiles
}

// Stats are the counters /debug/stats reports.
type Stats struct {
	// Completions served in full.
	Completions int `json:"completions"`
	// StreamsCancelled counts streams stopped because the client left.
	StreamsCancelled int `json:"streams_cancelled"`
	// RequestsCancelled counts non-streamed completions whose client left.
	RequestsCancelled int `json:"requests_cancelled"`
	// Aborted counts completions aborted by a sleep with mode=abort.
	Aborted int `json:"aborted"`
	// Rejected counts completions refused because the model slept or its
	// weights were not reloaded.
	Rejected int `json:"rejected"`
	// Running and Waiting are the completions in flight now.
	Running int `json:"running"`
	Waiting int `json:"waiting"`
	// IsSleeping is what /is_sleeping says; SleepState the metric's label.
	IsSleeping bool   `json:"is_sleeping"`
	SleepState string `json:"sleep_state"`
	// WeightsLoaded is false between a level-2 wake and reload_weights.
	WeightsLoaded bool `json:"weights_loaded"`
	// WeightsBytes is the emulated weights memory held now.
	WeightsBytes int `json:"weights_bytes"`
	// Connections counts the connections accepted (CountConnection).
	Connections int `json:"connections"`
	// Priorities counts the completions by their priority field ("none":
	// without one).
	Priorities map[string]int `json:"priorities,omitempty"`
	// SelfSleeps counts llama.cpp's own idle sleeps (SleepIdle), Reloads
	// the reloads a task started after one.
	SelfSleeps int `json:"self_sleeps"`
	Reloads    int `json:"reloads"`
	// LoadedBytes of LoadBytes (LoadFiles) read so far; Loaded once all.
	LoadedBytes int64 `json:"loaded_bytes"`
	LoadBytes   int64 `json:"load_bytes"`
	Loaded      bool  `json:"loaded"`
}

// ControlRequest is one control-plane request as /debug/requests lists it.
type ControlRequest struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Query  string `json:"query"`
	Body   string `json:"body,omitempty"`
}

// maxControlLog bounds the /debug/requests history.
const maxControlLog = 1000

// job is one admitted completion.
type job struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	ordinal int
	running bool
	decoded int // tokens generated so far
}

// New builds an engine; its startup delay starts now, and the weights
// memory is allocated before it returns.
func New(opts Options) *Engine {
	if len(opts.Models) == 0 {
		opts.Models = []string{"demo"}
	}
	if opts.MaxNumSeqs <= 0 {
		opts.MaxNumSeqs = defaultMaxNumSeqs
	}
	if opts.Flavor == "" {
		opts.Flavor = FlavorVLLM
	}
	e := &Engine{
		opts:    opts,
		log:     opts.Logger,
		exit:    opts.Exit,
		started: time.Now(),
		slots:   make(chan struct{}, opts.MaxNumSeqs),
		asleep:  map[string]bool{},
		jobs:    map[*job]struct{}{},
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.exit == nil {
		e.exit = os.Exit
	}
	e.weights = allocate(opts.MemoryBytes)
	e.startLoad()
	e.startIdleSleep()
	return e
}

// allocate returns n bytes with every page written, so that they count in
// the process's resident set rather than being lazily mapped.
func allocate(n int64) []byte {
	if n <= 0 {
		return nil
	}
	b := make([]byte, n)
	page := os.Getpagesize()
	for i := 0; i < len(b); i += page {
		b[i] = 1
	}
	return b
}

// CountConnection records an accepted connection (the server calls it),
// so a test can tell that nothing at all reached the engine.
func (e *Engine) CountConnection() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stats.Connections++
}

// loading reports whether the startup delay is still running or the
// LoadFiles are not read yet.
func (e *Engine) loading() bool {
	e.mu.Lock()
	done := e.load.done
	e.mu.Unlock()
	return !done || time.Since(e.started) < e.opts.StartupDelay
}

// Stats returns a snapshot of the counters and state.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Priorities = maps.Clone(e.stats.Priorities)
	s.Running, s.Waiting = e.running, e.waiting
	s.IsSleeping = len(e.asleep) > 0 || e.selfSleep.asleep
	s.SleepState = e.sleepStateLocked()
	s.WeightsLoaded = !e.stale
	s.WeightsBytes = len(e.weights)
	s.LoadedBytes, s.LoadBytes, s.Loaded = e.load.read, e.load.total, e.load.done
	return s
}

// ControlRequests returns the control-plane requests received, oldest first.
func (e *Engine) ControlRequests() []ControlRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]ControlRequest(nil), e.control...)
}

func (e *Engine) recordControl(c ControlRequest) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.control) == maxControlLog {
		e.control = append(e.control[:0], e.control[1:]...)
	}
	e.control = append(e.control, c)
}

// sleepStateLocked is the label of vllm:engine_sleep_state that is 1 now.
func (e *Engine) sleepStateLocked() string {
	switch {
	case len(e.asleep) == 0:
		return "awake"
	case e.level == 2:
		return "discard_all"
	default:
		return "weights_offloaded"
	}
}

// nextID numbers responses ("chatcmpl-7").
func (e *Engine) nextID() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ids++
	return e.ids
}

// admit registers a completion, refusing it while the model sleeps, and
// waits for a free sequence slot. The job's context is cancelled when the
// client leaves or a sleep aborts it (cause errAborted).
func (e *Engine) admit(parent context.Context) (*job, error) {
	if err := e.task(parent); err != nil {
		return nil, err
	}
	e.mu.Lock()
	switch {
	case len(e.asleep) > 0 || e.closing:
		e.stats.Rejected++
		e.mu.Unlock()
		return nil, errAsleep
	case e.stale:
		e.stats.Rejected++
		e.mu.Unlock()
		return nil, errStale
	}
	e.admitted++
	ctx, cancel := context.WithCancelCause(parent)
	j := &job{ctx: ctx, cancel: cancel, ordinal: e.admitted}
	e.jobs[j] = struct{}{}
	e.waiting++
	e.mu.Unlock()

	select {
	case e.slots <- struct{}{}:
	case <-ctx.Done():
		e.finish(j)
		return nil, context.Cause(ctx)
	}
	e.mu.Lock()
	e.waiting--
	e.running++
	j.running = true
	e.mu.Unlock()
	return j, nil
}

// finish unregisters a job and wakes a sleep waiting for the engine to drain.
func (e *Engine) finish(j *job) {
	e.mu.Lock()
	delete(e.jobs, j)
	if j.running {
		e.running--
		<-e.slots
	} else {
		e.waiting--
	}
	e.lastEnd = time.Now()
	e.taskEndedLocked()
	if len(e.jobs) == 0 && e.idle != nil {
		close(e.idle)
		e.idle = nil
	}
	e.mu.Unlock()
	j.cancel(nil)
}

// waitIdle blocks until no completion is admitted or ctx ends.
func (e *Engine) waitIdle(ctx context.Context) error {
	e.mu.Lock()
	if len(e.jobs) == 0 {
		e.mu.Unlock()
		return nil
	}
	if e.idle == nil {
		e.idle = make(chan struct{})
	}
	idle := e.idle
	e.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sleep puts the engine to sleep like vLLM's POST /sleep: admission closes,
// running completions are aborted (abort) or awaited (wait), then both
// memory tags sleep. Level 1 keeps the weights memory, level 2 frees it.
// Sleeping while asleep is a no-op, as in vLLM.
func (e *Engine) Sleep(ctx context.Context, level int, abort bool) error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return errSleeping
	}
	if len(e.asleep) > 0 {
		e.mu.Unlock()
		e.log.Warn("sleep: engine is already sleeping")
		return nil
	}
	e.closing = true
	if abort {
		for j := range e.jobs {
			j.cancel(errAborted)
		}
	}
	e.mu.Unlock()

	if err := e.waitIdle(ctx); err != nil {
		e.mu.Lock()
		e.closing = false
		e.mu.Unlock()
		return fmt.Errorf("sleep level %d: waiting for running requests: %w", level, err)
	}

	e.mu.Lock()
	e.closing = false
	e.asleep = map[string]bool{tagWeights: true, tagKVCache: true}
	e.level = level
	freed := level == 2 && e.weights != nil
	if level == 2 {
		e.weights = nil
	}
	e.mu.Unlock()
	if freed {
		// Return the pages to the OS now so that RSS drops as vLLM's GPU
		// memory does, instead of whenever the scavenger gets to it.
		debug.FreeOSMemory()
	}
	e.log.Info("sleeping", "level", level, "abort", abort)
	return nil
}

// WakeUp wakes the given memory tags (all when none) like vLLM's
// POST /wake_up, after the wake delay. As in vLLM it is a no-op when the
// engine is awake or a tag is not asleep. Waking the weights after a
// level-2 sleep re-allocates them, unloaded until reload_weights.
func (e *Engine) WakeUp(ctx context.Context, tags []string) error {
	if len(tags) == 0 {
		tags = []string{tagWeights, tagKVCache}
	}
	e.mu.Lock()
	for _, t := range tags {
		if !e.asleep[t] {
			e.mu.Unlock()
			e.log.Warn("wake_up: tag is not sleeping", "tag", t)
			return nil
		}
	}
	e.mu.Unlock()
	if err := e.delay(ctx, e.opts.WakeDelay); err != nil {
		return fmt.Errorf("wake_up %v: %w", tags, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.wakeTagsLocked(tags)
	e.log.Info("woken", "tags", tags, "is_sleeping", len(e.asleep) > 0)
	return nil
}

// wakeTagsLocked marks tags awake; a concurrent wake may have done so.
func (e *Engine) wakeTagsLocked(tags []string) {
	for _, t := range tags {
		if !e.asleep[t] {
			continue
		}
		delete(e.asleep, t)
		if t == tagWeights && e.level == 2 {
			e.weights = allocate(e.opts.MemoryBytes)
			e.stale = true
		}
	}
	if len(e.asleep) == 0 {
		e.level = 0
	}
}

// ReloadWeights is collective_rpc's reload_weights: it fills the weights a
// level-2 wake re-allocated, so the engine can serve again.
func (e *Engine) ReloadWeights() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.asleep[tagWeights] {
		return errors.New("reload_weights: the weights are asleep; wake_up?tags=weights first")
	}
	e.stale = false
	return nil
}

// Release is SGLang's release_memory_occupation: it refuses while
// requests run, then puts the tags (all when none) to sleep. The weights
// memory is kept, as with SGLang's CPU backup.
func (e *Engine) Release(tags []string) error {
	if len(tags) == 0 {
		tags = []string{tagWeights, tagKVCache}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.jobs) > 0 || e.closing {
		return errBusy
	}
	for _, t := range tags {
		if t != tagWeights && t != tagKVCache {
			return fmt.Errorf("release_memory_occupation: unknown tag %q", t)
		}
	}
	for _, t := range tags {
		e.asleep[t] = true
	}
	if e.level == 0 {
		e.level = 1
	}
	e.log.Info("memory released", "tags", tags)
	return nil
}

// Resume is SGLang's resume_memory_occupation: it wakes the tags (all when
// none) after the wake delay; resuming a tag that is not released is an
// error, as it is in SGLang.
func (e *Engine) Resume(ctx context.Context, tags []string) error {
	if len(tags) == 0 {
		tags = []string{tagWeights, tagKVCache}
	}
	e.mu.Lock()
	for _, t := range tags {
		if !e.asleep[t] {
			e.mu.Unlock()
			return fmt.Errorf("resume_memory_occupation: tag %q is not released", t)
		}
	}
	e.mu.Unlock()
	if err := e.delay(ctx, e.opts.WakeDelay); err != nil {
		return fmt.Errorf("resume_memory_occupation %v: %w", tags, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.wakeTagsLocked(tags)
	e.log.Info("memory resumed", "tags", tags)
	return nil
}

// delay waits d or until ctx ends, returning the context's cause.
func (e *Engine) delay(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Models returns the served model names.
func (e *Engine) Models() []string {
	return slices.Clone(e.opts.Models)
}
