package model

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

func llamaCpp(c *config.Model) {
	c.Sleep, c.SelfSleep, c.HealthInterval, c.HealthFailures = sleepmode.LlamaCpp, 30*time.Second, 10*time.Second, 3
}

// countRooms is a MakeRoom that counts the fit checks.
func countRooms(n *atomic.Int32) func(*Deps) {
	return func(d *Deps) {
		d.MakeRoom = func(context.Context, string, func(string)) ([]int, error) { n.Add(1); return nil, nil }
	}
}

// A llama-server that went to sleep by itself (its probe says so) makes
// the model asleep: its memory free room, the sleep an event, and the next
// request goes through the fit check and a wake before it is granted.
func TestSelfSleep_SeenByTheProbe(t *testing.T) {
	var rooms atomic.Int32
	r := newRigWith(t, supervisor.Awake, llamaCpp, countRooms(&rooms))
	r.expect(lifecycle.Awake)
	r.m.Tick() // starts watching
	r.sync()
	r.clock.Advance(10 * time.Second)
	r.probe(ProbeResult{Asleep: true})
	r.until("asleep", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Sleeping })
	s := r.m.Snapshot()
	if s.Slept != sleepmode.LlamaCpp || s.Freed.IsZero() || !strings.Contains(s.Lifecycle.Reason, "went to sleep by itself") {
		t.Fatalf("snapshot %+v; want asleep by itself, its memory freed", s)
	}
	if e := r.waitEvent(control.EventSleep, ""); !strings.Contains(e.Reason, "strategy llamacpp") {
		t.Errorf("sleep event %+v", e)
	}
	r.noCall() // napd asked nothing of the engine

	a := r.admit(context.Background())
	w := r.next("wake")
	if rooms.Load() != 1 {
		t.Errorf("%d fit checks before the wake, want 1", rooms.Load())
	}
	w.reply <- nil
	tk := r.granted(a)
	r.expect(lifecycle.Awake)
	if r.m.Snapshot().Slept != "" {
		t.Errorf("slept %q after the wake", r.m.Snapshot().Slept)
	}
	tk.Done(gateway.Outcome{})
}

// With no probe to tell, an arrival after the engine's own idle time (less
// a margin) takes it for asleep: a fit check and a wake first (which finds
// it awake, if it is); an arrival before that goes straight to it.
func TestSelfSleep_ArrivalAfterItsIdleTime(t *testing.T) {
	var rooms atomic.Int32
	r := newRigWith(t, supervisor.Awake, func(c *config.Model) { llamaCpp(c); c.HealthInterval = 0 }, countRooms(&rooms))
	r.expect(lifecycle.Awake)
	tk := r.granted(r.admit(context.Background()))
	tk.Done(gateway.Outcome{})
	r.sync()

	r.clock.Advance(26 * time.Second) // under 30 s less the 1 s margin
	tk = r.granted(r.admit(context.Background()))
	tk.Done(gateway.Outcome{})
	r.noCall()
	if rooms.Load() != 0 {
		t.Fatalf("%d fit checks for a request well within the engine's idle time", rooms.Load())
	}

	r.clock.Advance(29 * time.Second) // the engine's clock may be at 30 s
	a := r.admit(context.Background())
	w := r.next("wake")
	r.sync()
	if lc := r.m.Snapshot().Lifecycle; lc.State != lifecycle.Waking || !strings.Contains(lc.Reason, "its own idle sleep (30s): it may be asleep") {
		t.Errorf("lifecycle %+v; want waking, saying why", lc)
	}
	w.reply <- nil
	r.granted(a).Done(gateway.Outcome{})
	if rooms.Load() != 1 {
		t.Errorf("%d fit checks, want 1", rooms.Load())
	}
	r.sync()
	for len(r.events) > 0 {
		if e := <-r.events; e.Kind == control.EventSleep {
			t.Errorf("a sleep event %+v for an engine only taken for asleep", e)
		}
	}
}

// napd's own sleep of a llama-server (an operator's, the planner's) is a
// stop, recorded as one: the engine cannot be asked to sleep by itself.
func TestSelfSleep_NapdsSleepStops(t *testing.T) {
	r := newRig(t, supervisor.Awake, llamaCpp)
	r.expect(lifecycle.Awake)
	slept := r.operatorSleep()
	c := r.next("sleep")
	if c.strategy != sleepmode.Stop {
		t.Errorf("sleep strategy %q, want stop", c.strategy)
	}
	c.reply <- nil
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	r.until("slept with stop", func(s Snapshot) bool { return s.Slept == sleepmode.Stop })
}
