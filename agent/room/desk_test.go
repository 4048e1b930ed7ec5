package room

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/estimate"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/internal/fakeclock"
	"github.com/napd/napd/probes/gpu"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

// The desk's tests run it against fake models (their snapshots set by the
// test, their sleep requests recorded), measurements the rig makes up from
// what the test says the GPUs and engines hold, and a clock only the test
// advances: its timers (the poll while wakes wait, max_awake's wait) fire
// when the test moves it. Each test runs in a synctest bubble, so
// synctest.Wait tells when the desk and the wakes waiting on it have done
// all they can until the test acts again; nothing waits on a fixed sleep.

const GiB = int64(1) << 30

var t0 = time.Date(2026, 12, 2, 7, 59, 0, 0, time.Local) // a Wednesday

// fakeModel is one model as the desk sees it.
type fakeModel struct {
	name     string
	mu       sync.Mutex
	snap     model.Snapshot
	sleeps   []lifecycle.SleepRequest
	deepened []string
	yields   int // yields taken back
	admitted int // warm wakes
}

func (f *fakeModel) Name() string { return f.name }

func (f *fakeModel) Snapshot() model.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

// set changes the published snapshot, as the model's loop would.
func (f *fakeModel) set(change func(s *model.Snapshot)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.snap)
}

func (f *fakeModel) Admit(context.Context, lease.Request) (*gateway.Ticket, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.admitted++
	return &gateway.Ticket{Done: func(gateway.Outcome) {}}, nil
}

func (f *fakeModel) RequestSleep(req lifecycle.SleepRequest, _ lifecycle.Evidence) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sleeps = append(f.sleeps, req)
}

func (f *fakeModel) Deepen(strategy, cause string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deepened = append(f.deepened, strategy+" "+cause)
}

func (f *fakeModel) CancelYield() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.yields++
}

func (f *fakeModel) asked() []lifecycle.SleepRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sleeps)
}

func (f *fakeModel) warmed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.admitted
}

// memoMap is a Memo in memory.
type memoMap struct {
	mu sync.Mutex
	m  map[string]int64
}

func (m *memoMap) Get(name string) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[name]
	return v, ok
}

func (m *memoMap) Remember(name string, v int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m[name] = v
	return nil
}

// rig is a desk with its fakes. What the next measurement reads is set on
// it: the GPUs' sizes, what other processes hold on them, and per model
// what its engine holds and what its evidence says.
type rig struct {
	t          *testing.T
	clock      *fakeclock.Clock
	desk       *Desk
	cfg        *config.Config
	footprints *memoMap
	placements *memoMap

	mu       sync.Mutex
	models   []*fakeModel
	gpus     []int64 // total per GPU index; nil: a host without GPUs
	other    map[int]int64
	held     map[string]map[int]int64
	engines  map[string]planner.Engine
	procs    map[string][]int
	leases   map[string]int
	events   []control.Event
	measured int
	// prober, when set, makes the measurements instead: real probes over
	// what the test points them at.
	prober *measure.Prober
	// onMeasure, when set, runs once a measurement is made (a model's
	// state changing while the probes run).
	onMeasure func(ms *measure.Measurement)
}

func newRig(t *testing.T) *rig {
	r := &rig{
		t: t, clock: fakeclock.New(t0), cfg: config.Default(),
		footprints: &memoMap{m: map[string]int64{}}, placements: &memoMap{m: map[string]int64{}},
		gpus: []int64{24 * GiB}, other: map[int]int64{}, held: map[string]map[int]int64{},
		engines: map[string]planner.Engine{}, procs: map[string][]int{}, leases: map[string]int{},
	}
	r.cfg.Pressure.GPUReserve = 0
	r.desk = New(Deps{
		Models: func() []Model {
			r.mu.Lock()
			defer r.mu.Unlock()
			out := make([]Model, len(r.models))
			for i, m := range r.models {
				out[i] = m
			}
			return out
		},
		Config:     func() *config.Config { return r.cfg },
		Measure:    r.measure,
		Leases:     func(name string) lease.Evidence { return lease.Evidence{Active: r.leasesOf(name)} },
		Footprints: r.footprints, Placements: r.placements,
		Metrics: metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} }),
		Emit: func(e control.Event) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, e)
		},
		Clock: r.clock.Now, After: r.clock.After,
		// The desk's log is the test's: shown when it fails.
		Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	return r
}

// add configures a model on GPU 0 with a footprint of fp bytes, in state.
func (r *rig) add(name string, fp int64, state lifecycle.State, change ...func(c *config.Model)) *fakeModel {
	c := &config.Model{Name: name, GPUs: []int{0}, GPUMemory: fp, Sleep: sleepmode.Stop, DeepSleep: sleepmode.None,
		IdleTimeout: 15 * time.Minute, YieldAfter: 30 * time.Second, WakeAttempts: 1, WakeTimeout: time.Minute}
	for _, ch := range change {
		ch(c)
	}
	m := &fakeModel{name: name, snap: model.Snapshot{Config: c, Spec: supervisor.Spec{Model: name},
		Lifecycle: lifecycle.Snapshot{State: state, Since: r.clock.Now()}, LastUsed: r.clock.Now()}}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.models = append(r.models, m)
	r.cfg.Models = append(r.cfg.Models, c)
	r.engines[name] = planner.EngineIdle
	return m
}

// hold says what model's engine holds on GPU g.
func (r *rig) hold(name string, g int, b int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held[name] == nil {
		r.held[name] = map[int]int64{}
	}
	r.held[name][g] = b
}

func (r *rig) setLeases(name string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases[name] = n
}

func (r *rig) leasesOf(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leases[name]
}

func (r *rig) setEngine(name string, e planner.Engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.engines[name] = e
}

func (r *rig) rounds() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.measured
}

// measure is Deps.Measure: the GPUs and engines as the test set them,
// read at the desk's clock.
func (r *rig) measure(ctx context.Context, snaps []model.Snapshot) *measure.Measurement {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.measured++
	if r.prober != nil {
		return r.prober.Measure(ctx, snaps)
	}
	ms := &measure.Measurement{At: r.clock.Now(), GPUFrom: measure.GPULive, Models: map[string]measure.Model{}}
	for i, total := range r.gpus {
		used := r.other[i]
		for _, per := range r.held {
			used += per[i]
		}
		ms.GPUs.Devices = append(ms.GPUs.Devices, gpu.Device{Index: i, Total: total, Used: used, Free: total - used, HaveMemory: true})
		ms.Totals = append(ms.Totals, planner.GPU{Index: i, Total: total, Free: total})
	}
	for _, s := range snaps {
		name := s.Config.Name
		mm := measure.Model{Activity: r.engines[name], Proc: supervisor.Status{PIDs: r.procs[name]}}
		if len(r.held[name]) > 0 {
			mm.GPUBytes = maps(r.held[name])
		}
		ms.Models[name] = mm
	}
	if r.onMeasure != nil {
		r.onMeasure(ms)
	}
	return ms
}

func maps(m map[int]int64) map[int]int64 {
	out := make(map[int]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// wake is one wake asking the desk for room, as a model's wake goroutine
// does: it is waking, its requests hold leases, and the oldest of them
// arrived at oldest.
type wake struct {
	gpus   []int
	err    error
	done   chan struct{}
	told   []string
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (r *rig) wake(m *fakeModel, oldest time.Time) *wake {
	m.set(func(s *model.Snapshot) {
		s.Lifecycle.State, s.Lifecycle.Since = lifecycle.Waking, r.clock.Now()
		s.Oldest, s.QueueDepth = oldest, 1
	})
	if r.leasesOf(m.name) == 0 {
		r.setLeases(m.name, 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.t.Cleanup(cancel)
	w := &wake{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(w.done)
		w.gpus, w.err = r.desk.MakeRoom(ctx, m.name, func(why string) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.told = append(w.told, why)
		})
	}()
	return w
}

func (w *wake) answered() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *wake) lastTold() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.told) == 0 {
		return ""
	}
	return w.told[len(w.told)-1]
}

// run starts the desk's loop for the rest of the test.
func (r *rig) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.desk.Run(ctx) }()
	r.t.Cleanup(func() { cancel(); <-done })
}

// advance moves the clock (firing the desk's timers due) and waits until
// the desk and the wakes have done all they can.
func (r *rig) advance(d time.Duration) {
	r.clock.Advance(d)
	synctest.Wait()
}

// Turns go by each waiter's oldest waiting request, not by the order the
// wakes asked in: two wakes that do not both fit, the later request's
// wake registered first; the one whose request came first gets the room,
// the other waits for it ("ahead").
func TestDesk_TurnsByOldestWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		late, early := r.add("late", 16*GiB, lifecycle.Sleeping), r.add("early", 16*GiB, lifecycle.Sleeping)
		wl := r.wake(late, t0.Add(-5*time.Second))
		synctest.Wait()
		we := r.wake(early, t0.Add(-10*time.Second))
		synctest.Wait() // both registered before the desk's first round
		r.run()
		synctest.Wait()
		if !we.answered() || we.err != nil {
			t.Fatalf("the oldest waiter: answered %v, %v; want room", we.answered(), we.err)
		}
		if wl.answered() {
			t.Fatalf("the later waiter was answered (%v) while the earlier takes the room", wl.err)
		}
		if got := r.desk.WaitingFor("late"); !strings.Contains(got, "ahead early") {
			t.Errorf("late waits for %q, want the earlier waiter ahead of it", got)
		}
		if got := wl.lastTold(); !strings.Contains(got, "ahead early") {
			t.Errorf("late's loop was told %q", got)
		}
		// early loads: late still waits, now for early waking, and is told
		// on changes only (the poll plans again, the message stays).
		r.advance(Poll)
		if got := wl.lastTold(); !strings.Contains(got, "waking early") {
			t.Errorf("late's loop was told %q once early loads", got)
		}
		told := len(wl.told)
		r.advance(Poll)
		r.advance(Poll)
		if wl.answered() || len(wl.told) != told {
			t.Errorf("late answered %v or told again (%d, was %d) with nothing changed", wl.answered(), len(wl.told), told)
		}
		// early's engine is gone again: late fits.
		early.set(func(s *model.Snapshot) { s.Lifecycle.State = lifecycle.Sleeping })
		r.setLeases("early", 0)
		r.advance(Poll)
		if !wl.answered() || wl.err != nil {
			t.Fatalf("late after early left: answered %v, %v", wl.answered(), wl.err)
		}
		if r.desk.WaitingFor("late") != "" {
			t.Error("late still registered after its answer")
		}
	})
}

// A busy holder keeps serving until yield_after after the waiter's oldest
// request, then is asked to yield: the desk's poll, on its clock, is what
// notices the time. Once the holder's memory is back the waiter fits.
func TestDesk_YieldsAfterYieldAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		h := r.add("h", 20*GiB, lifecycle.Awake)
		r.hold("h", 0, 20*GiB)
		r.setLeases("h", 2)
		r.setEngine("h", planner.EngineBusy)
		w := r.add("w", 16*GiB, lifecycle.Sleeping)
		r.run()
		ww := r.wake(w, t0)
		synctest.Wait()
		if ww.answered() {
			t.Fatalf("w answered (%v) while h holds its memory", ww.err)
		}
		if got := ww.lastTold(); !strings.Contains(got, "busy h") {
			t.Errorf("w was told %q, want busy h", got)
		}
		if got := h.asked(); len(got) != 0 {
			t.Fatalf("h asked to sleep at once: %+v", got)
		}
		r.advance(29 * time.Second)
		if got := h.asked(); len(got) != 0 {
			t.Fatalf("h asked to sleep %s before yield_after: %+v", time.Second, got)
		}
		r.advance(time.Second)
		got := h.asked()
		if len(got) != 1 || got[0].Reason != lifecycle.Demand || got[0].Cause != string(planner.ReasonYield) {
			t.Fatalf("at yield_after h was asked %+v, want one demand sleep to yield", got)
		}
		if !strings.Contains(ww.lastTold(), "yielding h") {
			t.Errorf("w was told %q, want yielding h", ww.lastTold())
		}
		// Asked once: the next rounds, with nothing changed, do not ask again.
		r.advance(Poll)
		r.advance(Poll)
		if n := len(h.asked()); n != 1 {
			t.Errorf("h asked %d times, want once until Reask", n)
		}
		r.mu.Lock()
		decisions := 0
		for _, e := range r.events {
			if e.Kind == control.EventDecision && e.Model == "h" {
				decisions++
			}
		}
		r.mu.Unlock()
		if decisions != 1 {
			t.Errorf("%d decision events for h, want 1", decisions)
		}
		// h drains and sleeps: its memory comes back, w fits.
		h.set(func(s *model.Snapshot) {
			s.Lifecycle.State, s.Freed = lifecycle.Sleeping, r.clock.Now()
		})
		r.setLeases("h", 0)
		r.hold("h", 0, 0)
		r.advance(Poll)
		if !ww.answered() || ww.err != nil {
			t.Fatalf("w after h slept: answered %v, %v", ww.answered(), ww.err)
		}
	})
}

// A wake that can never fit (a pinned model holds the memory) is refused,
// but only on a measurement that began Settle after every engine gave
// memory back, and while none is draining: a reading of a moment when an
// engine is half gone would blame memory on a process napd does not know.
func TestDesk_RefusesOnlyOnSettledMeasurements(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.add("p", 20*GiB, lifecycle.Awake, func(c *config.Model) { c.Pinned = true })
		r.hold("p", 0, 20*GiB)
		x := r.add("x", 2*GiB, lifecycle.Draining)
		w := r.add("w", 16*GiB, lifecycle.Sleeping)
		r.run()
		ww := r.wake(w, t0)
		synctest.Wait()
		if ww.answered() {
			t.Fatalf("refused (%v) while x drains", ww.err)
		}
		// x has slept: its memory was given back at t0+100ms.
		r.clock.Advance(Confirm)
		x.set(func(s *model.Snapshot) { s.Lifecycle.State, s.Freed = lifecycle.Sleeping, r.clock.Now() })
		synctest.Wait()
		for range 9 { // measurements up to 900 ms after the freeing
			r.advance(Confirm)
			if ww.answered() {
				t.Fatalf("refused (%v) on a measurement %s after the freeing", ww.err, r.clock.Now().Sub(x.Snapshot().Freed))
			}
		}
		before := r.rounds()
		r.advance(Confirm) // Settle after the freeing
		if !ww.answered() {
			t.Fatalf("not refused on a measurement Settle after the freeing (%d rounds since)", r.rounds()-before)
		}
		var ref *gateway.Refusal
		if !errors.As(ww.err, &ref) || ref.Status != http.StatusServiceUnavailable || ref.Code != "insufficient_gpu_memory" ||
			!strings.Contains(ref.Message, "pinned p") || ref.RetryAfter <= 0 {
			t.Fatalf("refusal %#v, want a 503 naming pinned p with a Retry-After", ww.err)
		}
	})
}

// A waiter whose requests all left is let go (ErrNobodyWaits), and a yield
// nobody waits for any more is taken back.
func TestDesk_NobodyWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		h := r.add("h", 20*GiB, lifecycle.Awake)
		r.hold("h", 0, 20*GiB)
		r.setLeases("h", 1)
		w := r.add("w", 16*GiB, lifecycle.Sleeping)
		r.run()
		ww := r.wake(w, t0)
		synctest.Wait()
		h.set(func(s *model.Snapshot) { s.Lifecycle.State, s.Lifecycle.Yielding = lifecycle.Draining, true })
		r.setLeases("w", 0)
		r.advance(Poll)
		if !ww.answered() || !errors.Is(ww.err, ErrNobodyWaits) {
			t.Fatalf("w without requests: answered %v, %v", ww.answered(), ww.err)
		}
		r.desk.Poke()
		synctest.Wait()
		h.mu.Lock()
		yields := h.yields
		h.mu.Unlock()
		if yields == 0 {
			t.Error("h's yield was not taken back once nobody waited")
		}
		// With nobody waiting, a model going idle does not wake the desk.
		n := r.rounds()
		r.desk.ModelIdle()
		r.advance(time.Minute)
		if r.rounds() != n {
			t.Errorf("the desk measured %d times with nobody waiting", r.rounds()-n)
		}
	})
}

// warm_on_start wakes the models that fit as things are, nothing put to
// sleep for them; a keep_awake window's start wakes its model once, on
// the planner's round, and keeps it from its idle timeout while it holds.
func TestDesk_WarmWakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.add("busy", 10*GiB, lifecycle.Awake)
		r.hold("busy", 0, 10*GiB)
		r.setLeases("busy", 1)
		small := r.add("small", 8*GiB, lifecycle.Sleeping, func(c *config.Model) { c.WarmOnStart = true })
		big := r.add("big", 16*GiB, lifecycle.Sleeping, func(c *config.Model) { c.WarmOnStart = true })
		plain := r.add("plain", 1*GiB, lifecycle.Sleeping)
		win, err := config.ParseWindow("daily 08:00..09:00")
		if err != nil {
			t.Fatal(err)
		}
		kept := r.add("kept", 1*GiB, lifecycle.Sleeping, func(c *config.Model) { c.KeepAwake = []config.Window{win} })
		r.desk.WarmOnStart(context.Background())
		synctest.Wait()
		if small.warmed() != 1 || big.warmed() != 0 || plain.warmed() != 0 || kept.warmed() != 0 {
			t.Fatalf("warm_on_start woke small %d, big %d (does not fit), plain %d, kept %d; want 1 0 0 0",
				small.warmed(), big.warmed(), plain.warmed(), kept.warmed())
		}
		if len(r.models[0].asked()) != 0 {
			t.Error("a warm wake put busy to sleep")
		}
		ctx := context.Background()
		r.clock.Advance(30 * time.Second) // 07:59:30
		r.desk.Plan(ctx)
		synctest.Wait()
		if kept.warmed() != 0 {
			t.Fatal("kept woken before its window")
		}
		r.clock.Advance(time.Minute) // 08:00:30
		r.desk.Plan(ctx)
		synctest.Wait()
		if kept.warmed() != 1 {
			t.Fatalf("kept woken %d times when its window started, want 1", kept.warmed())
		}
		// Awake and idle far past its idle timeout: kept while the window
		// holds, put to sleep after.
		kept.set(func(s *model.Snapshot) {
			s.Lifecycle.State, s.Lifecycle.AwakeSince = lifecycle.Awake, t0.Add(-time.Hour)
		})
		for range 3 {
			r.clock.Advance(15 * time.Minute)
			r.desk.Plan(ctx)
			synctest.Wait()
		}
		if kept.warmed() != 1 || len(kept.asked()) != 0 {
			t.Fatalf("in its window: woken %d times, asked to sleep %+v", kept.warmed(), kept.asked())
		}
		r.clock.Advance(25 * time.Minute) // 09:10:30
		r.desk.Plan(ctx)
		if got := kept.asked(); len(got) != 1 || got[0].Reason != lifecycle.IdleTimeout {
			t.Errorf("after its window: asked %+v, want an idle-timeout sleep", got)
		}
	})
}

// max_awake: a wake beyond the limit has the least recently used idle
// model put to sleep and waits, on the desk's clock, until it is asleep;
// while none is idle it waits and says why; warm wakes respect it.
func TestDesk_MaxAwake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.cfg.Policy.MaxAwake = 1
		old := r.add("old", 1*GiB, lifecycle.Awake)
		r.hold("old", 0, 1*GiB)
		w := r.add("w", 1*GiB, lifecycle.Sleeping, func(c *config.Model) { c.WarmOnStart = true })
		r.desk.WarmOnStart(context.Background())
		synctest.Wait()
		if w.warmed() != 0 || len(old.asked()) != 0 {
			t.Fatalf("a warm wake past max_awake: woken %d, old asked %+v", w.warmed(), old.asked())
		}
		r.run()
		ww := r.wake(w, t0)
		synctest.Wait()
		if got := old.asked(); len(got) != 1 || got[0].Reason != lifecycle.Demand || got[0].Cause != string(planner.ReasonMaxAwake) {
			t.Fatalf("old asked %+v, want one max-awake sleep", got)
		}
		if ww.answered() {
			t.Fatalf("w answered (%v) before old sleeps", ww.err)
		}
		r.advance(Poll)
		if ww.answered() || len(old.asked()) != 1 {
			t.Fatalf("w answered %v, old asked %d times: want waiting, asked once", ww.answered(), len(old.asked()))
		}
		old.set(func(s *model.Snapshot) { s.Lifecycle.State = lifecycle.Sleeping })
		r.hold("old", 0, 0)
		r.advance(Poll)
		if !ww.answered() || ww.err != nil {
			t.Fatalf("w after old slept: answered %v, %v", ww.answered(), ww.err)
		}

		// None idle: the wake waits and says for whom, until its deadline.
		busy := r.add("busy", 1*GiB, lifecycle.Awake)
		r.setLeases("busy", 1)
		w.set(func(s *model.Snapshot) { s.Lifecycle.State = lifecycle.Awake })
		late := r.add("late", 1*GiB, lifecycle.Sleeping)
		wl := r.wake(late, r.clock.Now())
		synctest.Wait()
		if len(busy.asked()) != 0 || !strings.Contains(wl.lastTold(), "waiting for one of") {
			t.Fatalf("busy asked %+v; late told %q", busy.asked(), wl.lastTold())
		}
		wl.cancel()
		synctest.Wait()
		if !wl.answered() || !errors.Is(wl.err, context.Canceled) {
			t.Errorf("a cancelled wait: answered %v, %v", wl.answered(), wl.err)
		}
	})
}

// gpus = "any" or { count = N }: the wake's GPUs are chosen where it fits
// best, remembered, and returned with the room; an engine still running
// keeps its GPUs; a host without GPUs has nothing to choose; too few GPUs
// is a 503.
func TestDesk_Placement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.gpus = []int64{24 * GiB, 24 * GiB, 24 * GiB}
		r.other[1] = 12 * GiB
		one := r.add("one", 16*GiB, lifecycle.Sleeping, func(c *config.Model) { c.GPUs, c.GPUCount = nil, 1 })
		two := r.add("two", 16*GiB, lifecycle.Sleeping, func(c *config.Model) { c.GPUs, c.GPUCount = nil, 2 })
		r.run()
		if got := r.desk.GPUs(one.Snapshot()); got != nil {
			t.Fatalf("one placed before its first wake: %v", got)
		}
		w1 := r.wake(one, t0)
		synctest.Wait()
		if !w1.answered() || w1.err != nil || !slices.Equal(w1.gpus, []int{0}) {
			t.Fatalf("one: %v %v, want GPU 0 (the freest, the lowest index)", w1.gpus, w1.err)
		}
		if got := r.desk.GPUs(one.Snapshot()); !slices.Equal(got, []int{0}) || r.desk.PlacedWhy("one") == "" {
			t.Errorf("one's placement remembered as %v (%q)", got, r.desk.PlacedWhy("one"))
		}
		one.set(func(s *model.Snapshot) { s.Lifecycle.State = lifecycle.Awake })
		r.hold("one", 0, 16*GiB)
		w2 := r.wake(two, t0)
		synctest.Wait()
		if !w2.answered() || w2.err != nil || !slices.Equal(w2.gpus, []int{1, 2}) {
			t.Fatalf("two: %v %v, want GPUs 1 and 2 (8 GiB each fits beside one and the other processes)", w2.gpus, w2.err)
		}

		// one sleeps with its engine kept (a strategy that keeps the
		// process): its next wake stays where it is, though GPU 2 is freer.
		one.set(func(s *model.Snapshot) { s.Lifecycle.State = lifecycle.Sleeping })
		r.hold("one", 0, 0)
		r.hold("two", 1, 8*GiB)
		r.hold("two", 2, 8*GiB)
		r.other[0] = 4 * GiB
		r.procs["one"] = []int{4711}
		w1 = r.wake(one, r.clock.Now())
		synctest.Wait()
		if !w1.answered() || w1.err != nil || !slices.Equal(w1.gpus, []int{0}) {
			t.Errorf("one with its engine running: %v %v, want GPU 0 again", w1.gpus, w1.err)
		}

		// Too few GPUs report memory: a 503.
		r.gpus = []int64{24 * GiB}
		clear(r.other)
		clear(r.held)
		w2 = r.wake(two, r.clock.Now())
		synctest.Wait()
		var ref *gateway.Refusal
		if !w2.answered() || !errors.As(w2.err, &ref) || ref.Status != http.StatusServiceUnavailable || !strings.Contains(ref.Message, "cannot place") {
			t.Errorf("two on one GPU: %v %v, want a 503 naming the placement", w2.gpus, w2.err)
		}
		// A host without GPUs: nothing to choose, nothing to check.
		r.gpus = nil
		w2 = r.wake(two, r.clock.Now())
		synctest.Wait()
		if !w2.answered() || w2.err != nil || w2.gpus != nil {
			t.Errorf("two without GPUs: %v %v, want nil, nil", w2.gpus, w2.err)
		}
	})
}

// The planner's round learns the footprint of an awake model from what its
// engine holds, and a model idle past its timeout is asked to sleep, with
// the decision published once.
func TestDesk_PlanLearnsAndSleepsIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		m := r.add("m", 0, lifecycle.Awake, func(c *config.Model) { c.IdleTimeout = time.Minute })
		m.set(func(s *model.Snapshot) { s.Lifecycle.AwakeSince = t0 })
		r.hold("m", 0, 6*GiB)
		if fp := r.desk.Footprint(m.Snapshot()); fp.Bytes != 0 {
			t.Fatalf("footprint before any measurement: %+v", fp)
		}
		r.desk.Plan(context.Background())
		if fp := r.desk.Footprint(m.Snapshot()); fp.Bytes != 6*GiB || fp.Source != control.FootprintMeasured {
			t.Errorf("footprint after a round: %+v, want 6 GiB measured", fp)
		}
		if len(m.asked()) != 0 {
			t.Fatalf("asked to sleep before its idle timeout: %+v", m.asked())
		}
		r.clock.Advance(2 * time.Minute)
		r.desk.Plan(context.Background())
		if got := m.asked(); len(got) != 1 || got[0].Reason != lifecycle.IdleTimeout {
			t.Fatalf("idle past its timeout: asked %+v", got)
		}
		if r.desk.Measured() == nil || !r.desk.Measured().At.Equal(r.clock.Now()) {
			t.Error("the round's measurement is not the published one")
		}
	})
}

// Before a model was ever measured its footprint is estimated: vLLM's
// utilization flag of the GPUs' size wins over the model files (vLLM takes
// that share whatever the weights), which count otherwise; the files are
// read once per command.
func TestDesk_FootprintEstimates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		dir := t.TempDir()
		f, err := os.Create(filepath.Join(dir, "a.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(2 * GiB); err != nil {
			t.Fatal(err)
		}
		f.Close()
		flag := r.add("flag", 0, lifecycle.Sleeping, func(c *config.Model) {
			c.Command = []string{"vllm", "serve", dir, "--gpu-memory-utilization", "0.5"}
		})
		files := r.add("files", 0, lifecycle.Sleeping, func(c *config.Model) { c.Command = []string{"vllm", "serve", dir} })
		r.desk.Plan(context.Background()) // a measurement: the GPUs' size
		if fp := r.desk.Footprint(flag.Snapshot()); fp.Bytes != 12*GiB || fp.Source != control.FootprintEstimated {
			t.Errorf("with the flag: %+v, want half of the 24 GiB GPU, estimated", fp)
		}
		want := 2*GiB*6/5 + estimate.Overhead
		if fp := r.desk.Footprint(files.Snapshot()); fp.Bytes != want || fp.Source != control.FootprintEstimated || fp.From == "" {
			t.Errorf("from the files: %+v, want %d bytes estimated", fp, want)
		}
		if err := os.Remove(filepath.Join(dir, "a.safetensors")); err != nil {
			t.Fatal(err)
		}
		if fp := r.desk.Footprint(files.Snapshot()); fp.Bytes != want {
			t.Errorf("the files were read again: %+v", fp)
		}
	})
}

// A holder that turned serving while the measurement ran was not scraped
// by it (it was waking): its evidence is judged at the next round, so the
// waiter behind it waits rather than being refused as behind a holder
// whose idleness cannot be proven (tests/planner saw it under a CPU hog).
func TestDesk_JustAwakeHolderIsNotUntracked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		a := r.add("a", 16*GiB, lifecycle.Waking)
		r.hold("a", 0, 16*GiB)
		r.setEngine("a", planner.EngineNone) // not scraped: waking when measured
		r.setLeases("a", 1)                  // its stream
		b := r.add("b", 16*GiB, lifecycle.Sleeping)
		r.onMeasure = func(ms *measure.Measurement) {
			a.set(func(s *model.Snapshot) {
				s.Lifecycle.State, s.Lifecycle.Since = lifecycle.Awake, ms.At.Add(time.Nanosecond)
			})
		}
		r.run()
		bw := r.wake(b, t0)
		synctest.Wait()
		if bw.answered() {
			t.Fatalf("refused (%v) behind a model awake since after the measurement", bw.err)
		}
	})
}
