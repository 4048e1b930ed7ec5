package model

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// fakeMeter is an engine whose one process has read what the test says.
type fakeMeter struct {
	mu      sync.Mutex
	read    uint64
	weights int64
}

func (f *fakeMeter) Weights(*config.Model, supervisor.Spec) int64 { return f.weights }

func (f *fakeMeter) Read(context.Context, supervisor.Spec) (loadprogress.Counts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return loadprogress.Counts{100: f.read}, nil
}

func (f *fakeMeter) set(n uint64) {
	f.mu.Lock()
	f.read = n
	f.mu.Unlock()
}

func loadRig(t *testing.T, meter *fakeMeter, tune func(*config.Model)) *rig {
	return newRigWith(t, supervisor.Stopped, tune, func(d *Deps) { d.Load = meter })
}

// reading has the loop take a reading of the load at the clock's time and
// returns the event it published.
func (r *rig) reading() control.Event {
	r.t.Helper()
	r.m.Tick()
	return r.waitEvent(control.EventLoad, "")
}

// A waking engine's reads are its load's progress, published in the
// snapshot and as load events; the baseline is what its processes had
// read when the wake started.
func TestLoad_ProgressPublished(t *testing.T) {
	const gib = 1 << 30
	meter := &fakeMeter{read: 7, weights: 4 * gib}
	r := loadRig(t, meter, nil)
	a := r.admit(context.Background())
	wake := r.next("wake")
	r.until("load measured", func(s Snapshot) bool { return s.Load != nil })
	meter.set(7 + gib)
	r.clock.Advance(10 * time.Second)
	e := r.reading()
	if e.Load == nil || e.Load.ReadBytes != gib || e.Load.WeightBytes != 4*gib || e.Load.Progress == nil || *e.Load.Progress != 0.25 ||
		e.Load.LeftMs == nil || *e.Load.LeftMs != 30_000 {
		t.Fatalf("load event %+v, want a quarter of 4 GiB read, 30 s left at that rate", e.Load)
	}
	if s := r.m.Snapshot(); s.Load == nil || s.Load.Read != gib {
		t.Fatalf("snapshot load %+v", s.Load)
	}
	wake.reply <- nil
	r.granted(a).Done(gateway.Outcome{})
	r.expect(lifecycle.Awake)
	if s := r.m.Snapshot(); s.Load != nil {
		t.Fatalf("an awake model shows a load: %+v", s.Load)
	}
}

// A load that shows no progress for wake_stall_timeout fails its wake
// then, by the model's clock, long before wake_timeout: its engine is
// stopped and the reason says why.
func TestLoad_StallFailsTheWakeEarly(t *testing.T) {
	meter := &fakeMeter{weights: 4 << 30}
	r := loadRig(t, meter, func(c *config.Model) { c.WakeStallTimeout = 30 * time.Second; c.WakeAttempts = 1 })
	a := r.admit(context.Background())
	r.next("wake")
	r.until("load measured", func(s Snapshot) bool { return s.Load != nil })
	r.clock.Advance(5 * time.Second)
	meter.set(1 << 20) // some progress at 5 s
	r.reading()
	r.clock.Advance(29 * time.Second) // 29 s quiet
	r.reading()
	r.expect(lifecycle.Waking)
	r.clock.Advance(time.Second)
	r.m.Tick()
	r.next("sleep") // the stalled engine is stopped
	_, err := a.result(t)
	var ref *gateway.Refusal
	if !errors.As(err, &ref) || ref.Status != http.StatusServiceUnavailable || !strings.Contains(ref.Message, "load stalled: no progress for 30s") {
		t.Fatalf("admission: %v, want 503 saying the load stalled", err)
	}
	if s := r.m.Snapshot(); s.Lifecycle.State != lifecycle.Failed || !strings.Contains(s.Lifecycle.Reason, "wake_stall_timeout") {
		t.Fatalf("state %v %q, want failed for the stall", s.Lifecycle.State, s.Lifecycle.Reason)
	}
}

// Without wake_stall_timeout a quiet load waits for wake_timeout.
func TestLoad_NoStallTimeoutByDefault(t *testing.T) {
	meter := &fakeMeter{weights: 4 << 30}
	r := loadRig(t, meter, nil)
	r.admit(context.Background())
	r.next("wake")
	r.until("load measured", func(s Snapshot) bool { return s.Load != nil })
	r.clock.Advance(50 * time.Second) // wake_timeout is a minute
	r.reading()
	r.expect(lifecycle.Waking)
}

// The time from a wake's last weight byte to serving is learned: the next
// wake's time left counts it after the rate's.
func TestLoad_TailLearned(t *testing.T) {
	meter := &fakeMeter{weights: 100}
	r := loadRig(t, meter, nil)
	wakeAt := func(full time.Duration) {
		a := r.admit(context.Background())
		wake := r.next("wake")
		r.until("load measured", func(s Snapshot) bool { return s.Load != nil })
		meter.set(100)
		r.clock.Advance(full)
		r.reading()
		r.clock.Advance(4 * time.Second) // the set-up after the weights
		wake.reply <- nil
		r.granted(a).Done(gateway.Outcome{})
		r.expect(lifecycle.Awake)
		r.m.StartSleep("")
		r.next("sleep").reply <- nil
		r.until("asleep", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Sleeping })
		meter.set(0)
	}
	wakeAt(10 * time.Second)
	r.admit(context.Background())
	r.next("wake")
	r.until("load measured", func(s Snapshot) bool { return s.Load != nil })
	meter.set(25)
	r.clock.Advance(10 * time.Second)
	e := r.reading()
	// The rate says 30 s, the tail 4 s; the learned wake (14 s) 4 s:
	// 0.25 × 34 + 0.75 × 4 = 11.5 s.
	if e.Load == nil || e.Load.LeftMs == nil || *e.Load.LeftMs != 11_500 {
		t.Fatalf("load %+v, want 11.5 s left with the learned tail", e.Load)
	}
}
