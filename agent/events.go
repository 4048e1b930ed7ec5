package agent

import (
	"context"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/events"
)

// startEventPublisher binds the PUB socket of agent.events_address and
// forwards the lifecycle events (state, wake, sleep) the agent emits until
// ctx ends, then closes it. The hub drops events the publisher does not
// take at once, so publishing never slows a model's loop.
func (a *Agent) startEventPublisher(ctx context.Context, address string) error {
	pub, err := events.NewPublisher(address)
	if err != nil {
		return err
	}
	ch, unsubscribe := a.hub.subscribe()
	a.helpers.Add(1)
	go func() {
		defer a.helpers.Done()
		defer pub.Close()
		defer unsubscribe()
		for {
			select {
			case <-ctx.Done():
				return
			case e := <-ch:
				ev, ok := lifecycleEvent(e)
				if !ok {
					continue
				}
				if err := pub.Publish(ev); err != nil {
					a.log.Warn("publishing a lifecycle event", "err", err)
				}
			}
		}
	}()
	a.log.Info("publishing lifecycle events", "address", address)
	return nil
}

// published are the event kinds the ZMQ schema carries, by their kind
// there.
var published = map[control.EventKind]events.Kind{
	control.EventState: events.KindState,
	control.EventWake:  events.KindWake,
	control.EventSleep: events.KindSleep,
}

// lifecycleEvent maps an agent event onto the published schema; planner
// decisions and reloads are not model lifecycle events.
func lifecycleEvent(e control.Event) (events.Event, bool) {
	kind, ok := published[e.Kind]
	if e.Model == "" || !ok {
		return events.Event{}, false
	}
	return events.Event{
		Time: e.Time, Model: e.Model, Kind: kind, From: e.From, To: e.To, Reason: e.Reason,
		WakeDuration: time.Duration(e.WakeMs) * time.Millisecond,
	}, true
}
