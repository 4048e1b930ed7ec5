package model

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
	"github.com/napd/napd/supervisor"
)

const (
	interactive priority.Class = 1
	dflt        priority.Class = 2
	batch       priority.Class = 3
)

// admitReq is an admission of req on its own goroutine.
func (r *rig) admitReq(ctx context.Context, req lease.Request) *admission {
	a := &admission{done: make(chan struct{})}
	req.Model, req.Kind = "m", request.Chat
	go func() {
		defer close(a.done)
		a.ticket, a.err = r.m.Admit(ctx, req)
	}()
	return a
}

// classed is one queued request of a test: its label and admission.
type classed struct {
	label string
	a     *admission
}

// grantOrder frees the held slot one request at a time and returns the
// labels of the queued requests in the order they are granted, and their
// tickets.
func (r *rig) grantOrder(held *gateway.Ticket, q []classed) ([]string, []*gateway.Ticket) {
	r.t.Helper()
	var order []string
	var tickets []*gateway.Ticket
	for range q {
		held.Done(gateway.Outcome{})
		var next *classed
		for next == nil {
			r.sync()
			for i := range q {
				if q[i].a != nil && !q[i].a.pending() {
					next = &q[i]
					break
				}
			}
		}
		held = r.granted(next.a)
		order, tickets = append(order, next.label), append(tickets, held)
		next.a = nil
	}
	held.Done(gateway.Outcome{})
	return order, tickets
}

func (r *rig) queue(reqs map[string]lease.Request, labels ...string) []classed {
	r.t.Helper()
	var q []classed
	base := r.m.Snapshot().QueueDepth
	for _, l := range labels {
		q = append(q, classed{l, r.admitReq(context.Background(), reqs[l])})
		n := base + len(q)
		r.until("queued", func(s Snapshot) bool { return s.QueueDepth == n })
	}
	return q
}

// Within a model a higher class is admitted first, whatever arrived
// before it; a request runs in its key's class, or lower if it asks, never
// higher; without a key class, in the model's default. The ticket carries
// the class, and engine_priority for the engine's field.
func TestAdmissionByClass(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) {
		c.Queue, c.Priority, c.PriorityAge, c.EnginePriority = 10, dflt, time.Minute, true
	})
	r.expect(lifecycle.Awake)
	held := r.granted(r.admitReq(context.Background(), lease.Request{Client: "x"}))
	reqs := map[string]lease.Request{
		"batch1":         {Client: "nightly", Priority: batch},
		"batch2":         {Client: "nightly", Priority: batch, Asked: interactive}, // cannot raise itself
		"keyless":        {Client: "plain"},
		"ide":            {Client: "ide", Priority: interactive},
		"ide-lowered":    {Client: "ide", Priority: interactive, Asked: batch},
		"keyless-raised": {Client: "plain", Asked: interactive},
	}
	q := r.queue(reqs, "batch1", "batch2", "keyless", "ide-lowered", "ide", "keyless-raised")
	order, tickets := r.grantOrder(held, q)
	if got := strings.Join(order, " "); got != "ide keyless keyless-raised batch1 batch2 ide-lowered" {
		t.Errorf("granted %q", got)
	}
	want := []priority.Class{interactive, dflt, dflt, batch, batch, batch}
	for i, tk := range tickets {
		if tk.Class != want[i] || !tk.EnginePriority {
			t.Errorf("%s: ticket class %d engine %v, want %d, true", order[i], tk.Class, tk.EnginePriority, want[i])
		}
	}
}

// The starvation bound on the loop's clock: a batch request queued behind
// a stream of interactive ones counts as one class higher per
// priority_age, and goes first once it counts as interactive (it is the
// oldest of that class).
func TestAdmissionAgesLowerClasses(t *testing.T) {
	for _, tc := range []struct {
		waited time.Duration
		want   string
	}{
		{59 * time.Second, "ide batch"},
		{time.Minute, "ide batch"}, // counts as default: still below interactive
		{2 * time.Minute, "batch ide"},
	} {
		t.Run(tc.waited.String(), func(t *testing.T) {
			r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Queue, c.Priority, c.PriorityAge = 10, dflt, time.Minute })
			r.expect(lifecycle.Awake)
			held := r.granted(r.admitReq(context.Background(), lease.Request{Client: "x"}))
			reqs := map[string]lease.Request{"batch": {Client: "n", Priority: batch}, "ide": {Client: "i", Priority: interactive}}
			q := r.queue(reqs, "batch")
			r.clock.Advance(tc.waited)
			q = append(q, r.queue(reqs, "ide")...)
			order, _ := r.grantOrder(held, q)
			if got := strings.Join(order, " "); got != tc.want {
				t.Errorf("after %s: granted %q, want %q", tc.waited, got, tc.want)
			}
		})
	}
}

// What the planner reads of classes: the oldest queued request of each
// class, the highest class in flight, and the highest of the last busy
// period (which outlives it, for eviction order).
func TestSnapshotClasses(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Queue, c.MaxConcurrency, c.Priority = 10, 2, dflt })
	r.expect(lifecycle.Awake)
	ctx := context.Background()
	b := r.granted(r.admitReq(ctx, lease.Request{Priority: batch}))
	if s := r.m.Snapshot(); s.Serving != batch || s.Recent != batch || s.Queued != nil {
		t.Errorf("one batch in flight: serving %d recent %d queued %v", s.Serving, s.Recent, s.Queued)
	}
	i := r.granted(r.admitReq(ctx, lease.Request{Priority: interactive}))
	t0 := r.clock.Now()
	q1 := r.admitReq(ctx, lease.Request{Priority: batch})
	r.until("one queued", func(s Snapshot) bool { return s.QueueDepth == 1 })
	r.clock.Advance(time.Second)
	q2 := r.admitReq(ctx, lease.Request{Priority: batch})
	r.until("two queued", func(s Snapshot) bool { return s.QueueDepth == 2 })
	s := r.m.Snapshot()
	if s.Serving != interactive || s.Recent != interactive {
		t.Errorf("interactive in flight: serving %d recent %d", s.Serving, s.Recent)
	}
	if s.Queued == nil || !s.Queued[batch-1].Equal(t0) || !s.Queued[interactive-1].IsZero() {
		t.Errorf("queued %v, want batch's oldest at %v", s.Queued, t0)
	}
	i.Done(gateway.Outcome{})
	b.Done(gateway.Outcome{})
	for _, a := range []*admission{q1, q2} {
		r.granted(a).Done(gateway.Outcome{})
	}
	r.until("idle", func(s Snapshot) bool { return s.Active == 0 })
	if s := r.m.Snapshot(); s.Serving != priority.None || s.Recent != interactive {
		t.Errorf("idle: serving %d recent %d, want none and interactive", s.Serving, s.Recent)
	}
	// The next busy period starts afresh.
	r.granted(r.admitReq(ctx, lease.Request{Priority: batch})).Done(gateway.Outcome{})
	r.until("idle", func(s Snapshot) bool { return s.Active == 0 && s.Recent == batch })
}

// fakeUsage records what the loop tells the accounting.
type fakeUsage struct {
	mu     sync.Mutex
	events []string
}

func (f *fakeUsage) add(e string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
}

func (f *fakeUsage) Begin(_ time.Time, model, key string)   { f.add("begin " + model + " " + key) }
func (f *fakeUsage) End(_ time.Time, model, key string)     { f.add("end " + model + " " + key) }
func (f *fakeUsage) Woke(_ time.Time, model, key string)    { f.add("woke " + model + " " + key) }
func (f *fakeUsage) Swapped(_ time.Time, model, key string) { f.add("swapped " + model + " " + key) }

func (f *fakeUsage) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

// The accounting is told when a granted request holds the engine (from
// grant to end), which key's request started a wake, and that the wake
// had to wait for another model's memory (a swap).
func TestUsageHooks(t *testing.T) {
	u := &fakeUsage{}
	room := make(chan func(string), 1)
	r := newRigWith(t, supervisor.Stopped, func(c *config.Model) { c.Queue, c.MaxConcurrency = 4, 2 }, func(d *Deps) {
		d.Usage = u
		d.MakeRoom = func(_ context.Context, _ string, waiting func(string)) ([]int, error) {
			waiting("busy other (1.0 GiB)")
			waiting("busy other (1.0 GiB), idle third (1.0 GiB)") // told again: one swap
			room <- waiting
			return nil, nil
		}
	})
	r.expect(lifecycle.Sleeping)
	q := r.queue(map[string]lease.Request{"alice": {Client: "alice"}, "bob": {Client: "bob"}}, "alice", "bob")
	<-room
	r.next("wake").reply <- nil
	r.sync()
	t1, t2 := r.granted(q[0].a), r.granted(q[1].a)
	r.sync()
	t1.Done(gateway.Outcome{})
	t2.Done(gateway.Outcome{})
	r.sync()
	want := []string{"woke m alice", "swapped m alice", "begin m alice", "begin m bob", "end m alice", "end m bob"}
	if got := u.seen(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("accounting told %q, want %q", got, want)
	}
}
