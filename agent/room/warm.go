package room

import (
	"context"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
)

// windowStarts names the models one of whose keep_awake windows started in
// (after, now]: they are woken when they fit.
func windowStarts(models []*config.Model, after, now time.Time) []string {
	var names []string
	for _, c := range models {
		for _, w := range c.KeepAwake {
			if w.StartedIn(after.Local(), now.Local()) {
				names = append(names, c.Name)
				break
			}
		}
	}
	return names
}

// WarmOnStart wakes the warm_on_start models, once napd has reconciled,
// each when it fits as things are. The wakes run on goroutines of their
// own, within ctx.
func (d *Desk) WarmOnStart(ctx context.Context) {
	for _, c := range d.d.Config().Models {
		if c.WarmOnStart {
			go d.warmWake(ctx, c.Name, "warm_on_start")
		}
	}
}

// windowsStarted wakes the models whose keep_awake window started since
// the last round (Plan's).
func (d *Desk) windowsStarted(ctx context.Context, now time.Time) {
	for _, name := range windowStarts(d.d.Config().Models, d.windowsAt, now) {
		go d.warmWake(ctx, name, "keep_awake window starts")
	}
	d.windowsAt = now
}

// warmWake wakes a sleeping model ahead of demand, when it fits as things
// are: nothing is put to sleep for it, and max_awake is respected. The
// wake is an arrival with no request behind it, like an operator's.
func (d *Desk) warmWake(ctx context.Context, name, why string) {
	models := d.d.Models()
	m := find(models, name)
	if m == nil {
		return
	}
	s := m.Snapshot()
	if s.Lifecycle.State != lifecycle.Sleeping {
		return
	}
	ms := d.measure(ctx, models)
	in := d.input(ms, models)
	if ma := planner.PlanMaxAwake(in, name, d.d.Config().Policy.MaxAwake); len(ma.Sleeps) > 0 || ma.Wait {
		d.d.Log.Info("warm wake skipped", "model", name, "why", why, "because", ma.Message)
		return
	}
	if len(d.GPUs(s)) > 0 && d.footprint(s, ms) > 0 {
		plan := planner.PlanRoom(in, []planner.Waiter{{Model: name, Oldest: ms.At}})
		if t, ok := plan.Turn(name); !ok || t.Verdict != planner.RoomFits {
			d.d.Log.Info("warm wake skipped", "model", name, "why", why, "because", t.Message)
			return
		}
	}
	d.d.Log.Info("warm wake", "model", name, "why", why)
	c := s.Config
	ctx, cancel := context.WithTimeout(ctx, time.Duration(c.WakeAttempts)*c.WakeTimeout+time.Minute)
	defer cancel()
	t, err := m.Admit(ctx, lease.Request{Model: name, Client: "napd", Kind: request.Other})
	if err != nil {
		d.d.Log.Warn("warm wake failed", "model", name, "err", err)
		return
	}
	t.Done(gateway.Outcome{})
}

// maxAwake is a wake's wait for policy.max_awake: the least recently used
// idle models are put to sleep until the wake is within the limit; while
// none is idle it waits (bounded by ctx), telling waiting why, and plans
// again every Poll.
func (d *Desk) maxAwake(ctx context.Context, name string, waiting func(why string)) error {
	limit := d.d.Config().Policy.MaxAwake
	if limit <= 0 {
		return nil
	}
	acted := map[string]time.Time{}
	told := ""
	for {
		models := d.d.Models()
		ms := d.measure(ctx, models)
		res := planner.PlanMaxAwake(d.input(ms, models), name, limit)
		if len(res.Sleeps) == 0 && !res.Wait {
			return nil
		}
		var fresh []planner.Decision
		for _, dec := range res.Sleeps {
			if at, ok := acted[dec.Model]; !ok || d.d.Clock().Sub(at) >= Reask {
				acted[dec.Model] = d.d.Clock()
				fresh = append(fresh, dec)
			}
		}
		d.act(ms, models, fresh)
		if res.Message != told {
			told = res.Message
			d.d.Log.Info("waiting for max_awake", "model", name, "why", res.Message)
			waiting(res.Message)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.d.After(Poll):
		}
	}
}
