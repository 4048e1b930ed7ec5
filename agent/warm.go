package agent

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

// inWindow reports whether one of the model's keep_awake windows holds at
// now (the host's time zone).
func inWindow(c *config.Model, now time.Time) bool {
	for _, w := range c.KeepAwake {
		if w.Contains(now.Local()) {
			return true
		}
	}
	return false
}

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

// warmWake wakes a sleeping model ahead of demand, when it fits as things
// are: nothing is put to sleep for it, and max_awake is respected. The
// wake is an arrival with no request behind it, like an operator's.
func (a *Agent) warmWake(ctx context.Context, name, why string) {
	m := a.reg.Load().byName[name]
	if m == nil {
		return
	}
	s := m.Snapshot()
	if s.Lifecycle.State != lifecycle.Sleeping {
		return
	}
	ms := a.measure(ctx)
	in := a.plannerInput(ms)
	if ma := planner.PlanMaxAwake(in, name, a.cfg.Load().Policy.MaxAwake); len(ma.Sleeps) > 0 || ma.Wait {
		a.log.Info("warm wake skipped", "model", name, "why", why, "because", ma.Message)
		return
	}
	if len(a.gpusOf(s)) > 0 && a.footprint(s) > 0 {
		plan := planner.PlanRoom(in, []planner.Waiter{{Model: name, Oldest: ms.at}})
		if t, ok := plan.Turn(name); !ok || t.Verdict != planner.RoomFits {
			a.log.Info("warm wake skipped", "model", name, "why", why, "because", t.Message)
			return
		}
	}
	a.log.Info("warm wake", "model", name, "why", why)
	c := s.Config
	ctx, cancel := context.WithTimeout(ctx, time.Duration(c.WakeAttempts)*c.WakeTimeout+time.Minute)
	defer cancel()
	t, err := m.Admit(ctx, lease.Request{Model: name, Client: "napd", Kind: request.Other})
	if err != nil {
		a.log.Warn("warm wake failed", "model", name, "err", err)
		return
	}
	t.Done(gateway.Outcome{})
}

// warmLoop wakes the warm_on_start models once napd has reconciled, then
// each model whose keep_awake window starts, on the planner's ticks.
func (a *Agent) warmLoop(ctx context.Context) {
	defer a.helpers.Done()
	for _, c := range a.cfg.Load().Models {
		if c.WarmOnStart {
			go a.warmWake(ctx, c.Name, "warm_on_start")
		}
	}
	prev := a.clock()
	tick := time.NewTicker(planEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := a.clock()
		for _, name := range windowStarts(a.cfg.Load().Models, prev, now) {
			go a.warmWake(ctx, name, "keep_awake window starts")
		}
		prev = now
	}
}

// maxAwake is a wake's wait for policy.max_awake: the least recently used
// idle models are put to sleep until the wake is within the limit; while
// none is idle it waits (bounded by ctx), telling waiting why.
func (a *Agent) maxAwake(ctx context.Context, name string, waiting func(why string)) error {
	max := a.cfg.Load().Policy.MaxAwake
	if max <= 0 {
		return nil
	}
	acted := map[string]time.Time{}
	told := ""
	for {
		ms := a.measure(ctx)
		res := planner.PlanMaxAwake(a.plannerInput(ms), name, max)
		if len(res.Sleeps) == 0 && !res.Wait {
			return nil
		}
		var fresh []planner.Decision
		for _, d := range res.Sleeps {
			if at, ok := acted[d.Model]; !ok || a.clock().Sub(at) >= roomReask {
				acted[d.Model] = a.clock()
				fresh = append(fresh, d)
			}
		}
		a.act(ms, fresh)
		if res.Message != told {
			told = res.Message
			a.log.Info("waiting for max_awake", "model", name, "why", res.Message)
			waiting(res.Message)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(roomPoll):
		}
	}
}
