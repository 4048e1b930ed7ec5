package agent

import (
	"context"

	"github.com/napd/napd/agent/events"
)

// startEventPublisher binds the PUB socket of agent.events_address and
// forwards the lifecycle events the agent emits until ctx ends. The hub
// drops events the publisher does not take at once, so publishing never
// slows a model's loop.
func (a *Agent) startEventPublisher(ctx context.Context, address string) error {
	pub, err := events.NewPublisher(address)
	if err != nil {
		return err
	}
	ch, unsubscribe := a.hub.Subscribe()
	a.helpers.Go(func() {
		defer unsubscribe()
		pub.Forward(ctx, ch, a.log)
	})
	a.log.Info("publishing lifecycle events", "address", address)
	return nil
}
