package model

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
	"github.com/napd/napd/supervisor"
)

// cloudTarget is Deps.Overflow over one remote model, "cloud", as the
// agent's is over its remote models: it moves the lease there when it
// takes the request (take), else answers ErrNoOverflow.
type cloudTarget struct {
	tracker *lease.Tracker
	clock   func() time.Time
	mu      sync.Mutex
	take    bool
	asked   int
}

func (c *cloudTarget) overflow(_ context.Context, targets []string, id lease.ID) (*gateway.Ticket, lease.Moved, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	if !c.take || len(targets) != 1 || targets[0] != "cloud" {
		return nil, lease.Moved{}, ErrNoOverflow
	}
	moved, err := c.tracker.Move(c.clock(), id, "cloud")
	if err != nil {
		return nil, lease.Moved{}, err
	}
	return &gateway.Ticket{Target: &url.URL{Scheme: "https", Host: "cloud.example"}, ServedBy: "cloud",
		Done: func(o gateway.Outcome) { c.tracker.End(c.clock(), id, o.Outcome) }}, moved, nil
}

func (c *cloudTarget) setTake(take bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.take = take
}

func (c *cloudTarget) times() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked
}

// overflowRig is a model with overflow = ["cloud"] (when) and the
// target; with changes more of its deps.
func overflowRig(t *testing.T, found supervisor.Observed, when string, tune func(*config.Model), with func(*Deps)) (*rig, *cloudTarget) {
	t.Helper()
	target := &cloudTarget{take: true}
	r := newRigWith(t, found, func(c *config.Model) {
		c.Overflow, c.OverflowWhen = []string{"cloud"}, when
		if tune != nil {
			tune(c)
		}
	}, func(d *Deps) {
		target.tracker, target.clock = d.Tracker, d.Clock
		d.Tracker.Register("cloud", d.Clock())
		d.Overflow = target.overflow
		if with != nil {
			with(d)
		}
	})
	return r, target
}

func (r *rig) leases(model string) int {
	ev, _ := r.m.d.Tracker.Evidence(model)
	return ev.Active
}

// overflowed waits for a's ticket and fails unless it is the target's.
func (r *rig) overflowed(a *admission) *gateway.Ticket {
	r.t.Helper()
	tk, err := a.result(r.t)
	if err != nil || tk == nil || tk.ServedBy != "cloud" {
		r.t.Fatalf("admission: ticket %+v, err %v; want cloud's", tk, err)
	}
	return tk
}

// A request the full queue would refuse goes to the overflow target,
// with its lease; with no target that can take it, it gets the 503, and
// so does one that cannot be served elsewhere (not routed by name:
// /upstream/MODEL/…, napctl wake).
func TestOverflow_QueueFull(t *testing.T) {
	r, target := overflowRig(t, supervisor.Awake, config.OverflowRefused, func(c *config.Model) { c.Queue = 0 }, nil)
	r.expect(lifecycle.Awake)
	first := r.granted(r.admit(context.Background()))
	var ref *gateway.Refusal
	if _, err := r.admit(context.Background()).result(t); !errors.As(err, &ref) || ref.Code != gateway.CodeQueueFull || target.times() != 0 {
		t.Fatalf("a request not routed by name: %v (target asked %d times), want the 503 here", err, target.times())
	}
	tk := r.overflowed(r.admitBy(0))
	if r.leases("m") != 1 || r.leases("cloud") != 1 {
		t.Errorf("leases: m %d, cloud %d; want one each", r.leases("m"), r.leases("cloud"))
	}
	tk.Done(gateway.Outcome{})
	target.setTake(false)
	_, err := r.admitBy(0).result(t)
	if !errors.As(err, &ref) || ref.Code != gateway.CodeQueueFull {
		t.Fatalf("no target takes it: %v, want the 503", err)
	}
	first.Done(gateway.Outcome{})
	r.until("idle", func(s Snapshot) bool { return s.Active == 0 })
	if r.leases("m") != 0 || r.leases("cloud") != 0 || target.times() != 2 {
		t.Errorf("leases m %d, cloud %d; target asked %d times", r.leases("m"), r.leases("cloud"), target.times())
	}
}

// A wake refused for want of GPU memory (a pinned holder) overflows its
// queue, in either mode; the model's own requests are not refused twice.
func TestOverflow_RoomRefusal(t *testing.T) {
	refusal := &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: gateway.CodeInsufficientGPUMemory,
		Message: "cannot fit m: held by pinned p", RetryAfter: time.Second}
	for _, when := range []string{config.OverflowRefused, config.OverflowLate} {
		t.Run(when, func(t *testing.T) {
			r, _ := overflowRig(t, supervisor.Stopped, when, nil, func(d *Deps) {
				d.MakeRoom = func(context.Context, string, func(string)) ([]int, error) { return nil, refusal }
			})
			r.expect(lifecycle.Sleeping)
			tk := r.overflowed(r.admitBy(0))
			tk.Done(gateway.Outcome{})
			r.until("asleep", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Sleeping })
			if r.leases("m") != 0 {
				t.Errorf("m holds %d leases", r.leases("m"))
			}
			r.noCall()
		})
	}
}

// learnWake wakes the model once, taking took on the clock, so that its
// typical wake is known, and puts it back to sleep.
func (r *rig) learnWake(took time.Duration) {
	r.t.Helper()
	a := r.admit(context.Background())
	wake := r.next("wake")
	r.clock.Advance(took)
	wake.reply <- nil
	r.granted(a).Done(gateway.Outcome{})
	slept := r.operatorSleep()
	r.next("sleep").reply <- nil
	if err := <-slept; err != nil {
		r.t.Fatal(err)
	}
}

// admitBy admits a request routed by name (one that may overflow) whose
// deadline is in on the model's clock; 0: none.
func (r *rig) admitBy(in time.Duration) *admission {
	ctx := context.Background()
	if in > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, r.clock.Now().Add(in))
		r.t.Cleanup(cancel)
	}
	a := &admission{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.ticket, a.err = r.m.Admit(ctx, lease.Request{Model: "m", Kind: request.Chat, ByName: true})
	}()
	return a
}

// overflow_when = "late": a request whose deadline comes before the wake
// it starts can end (the typical wake) goes to the target at once; one
// with time enough waits; under "refused" the late one waits too. The
// wake it started goes on.
func TestOverflow_LateAtArrival(t *testing.T) {
	r, _ := overflowRig(t, supervisor.Stopped, config.OverflowLate, func(c *config.Model) { c.Queue = 4 }, nil)
	r.expect(lifecycle.Sleeping)
	r.learnWake(10 * time.Second)

	late := r.admitBy(5 * time.Second)
	wake := r.next("wake")
	r.overflowed(late).Done(gateway.Outcome{})
	// Not routed by name, as late: it waits.
	ctx, cancel := context.WithDeadline(context.Background(), r.clock.Now().Add(5*time.Second))
	defer cancel()
	here := &admission{done: make(chan struct{})}
	go func() {
		defer close(here.done)
		here.ticket, here.err = r.m.Admit(ctx, lease.Request{Model: "m", Kind: request.Other})
	}()
	r.until("one queued", func(s Snapshot) bool { return s.QueueDepth == 1 })
	inTime := r.admitBy(30 * time.Second)
	r.until("two queued", func(s Snapshot) bool { return s.QueueDepth == 2 })
	wake.reply <- nil
	r.granted(here).Done(gateway.Outcome{}) // queued first, one slot
	r.granted(inTime).Done(gateway.Outcome{})

	refused, _ := overflowRig(t, supervisor.Stopped, config.OverflowRefused, nil, nil)
	refused.expect(lifecycle.Sleeping)
	refused.learnWake(10 * time.Second)
	waits := refused.admitBy(5 * time.Second)
	refused.next("wake").reply <- nil
	refused.granted(waits).Done(gateway.Outcome{})
}

// While the wake waits for room, the desk's estimate decides: a request
// that would be served after its deadline leaves the queue for the target
// once the estimate says so, not before.
func TestOverflow_LateWhileWaitingForRoom(t *testing.T) {
	room := make(chan struct{})
	r, _ := overflowRig(t, supervisor.Stopped, config.OverflowLate, func(c *config.Model) { c.Queue = 4 }, func(d *Deps) {
		d.MakeRoom = func(ctx context.Context, _ string, waiting func(string)) ([]int, error) {
			waiting("busy a (16.0 GiB)")
			select {
			case <-room:
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	})
	r.expect(lifecycle.Sleeping)
	a := r.admitBy(20 * time.Second)
	r.until("waiting for room", func(s Snapshot) bool { return s.Lifecycle.RoomWait })
	r.m.RoomExpected(r.clock.Now().Add(15 * time.Second))
	r.sync()
	if !a.pending() {
		t.Fatal("a request with time enough left the queue")
	}
	r.m.RoomExpected(r.clock.Now().Add(25 * time.Second))
	r.overflowed(a).Done(gateway.Outcome{})
	close(room)
}

// A late request no target can take waits here after all, and is not
// taken out of the queue again.
func TestOverflow_LateWithoutTargetWaits(t *testing.T) {
	r, target := overflowRig(t, supervisor.Stopped, config.OverflowLate, nil, nil)
	r.expect(lifecycle.Sleeping)
	r.learnWake(10 * time.Second)
	target.setTake(false)
	a := r.admitBy(5 * time.Second)
	wake := r.next("wake")
	r.until("back in the queue", func(s Snapshot) bool { return s.QueueDepth == 1 })
	r.m.Tick()
	r.sync()
	if n := target.times(); n != 1 {
		t.Errorf("the target was asked %d times, want once", n)
	}
	wake.reply <- nil
	r.granted(a).Done(gateway.Outcome{})
}
