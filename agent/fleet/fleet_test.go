package fleet

import (
	"testing"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agentcheck"
)

// TestBalancerHealth_EveryState: each lifecycle state has a deliberate
// answer; a state added later fails here until it is given one.
func TestBalancerHealth_EveryState(t *testing.T) {
	want := map[lifecycle.State]agentcheck.Health{
		lifecycle.Awake:       agentcheck.Serving,
		lifecycle.Unsupported: agentcheck.Serving,
		lifecycle.Waking:      agentcheck.Serving,
		lifecycle.Sleeping:    agentcheck.Wakeable,
		lifecycle.Unverified:  agentcheck.Wakeable,
		lifecycle.Draining:    agentcheck.Draining,
		lifecycle.Failed:      agentcheck.Failed,
	}
	for _, s := range lifecycle.States() {
		h, ok := want[s]
		if !ok {
			t.Errorf("state %s: no answer decided for balancers (Health)", s)
			continue
		}
		if got := Health(lifecycle.Snapshot{State: s}); got != h {
			t.Errorf("Health(%s) = %d, want %d", s, got, h)
		}
	}
	if got := Health(lifecycle.Snapshot{State: lifecycle.Waking, RoomWait: true}); got != agentcheck.Draining {
		t.Errorf("Health(waking for room) = %d, want Draining", got)
	}
}

// A stopping napd tells balancers to drain every model, whatever its
// state, and keeps reporting its queue.
func TestBalancerStatus_Stopping(t *testing.T) {
	awake := model.Snapshot{Lifecycle: lifecycle.Snapshot{State: lifecycle.Awake}, QueueDepth: 3}
	if got := Status(awake, false); got != (agentcheck.Status{Health: agentcheck.Serving, State: "awake", QueueDepth: 3}) {
		t.Errorf("awake: %+v", got)
	}
	for _, s := range lifecycle.States() {
		snap := awake
		snap.Lifecycle.State = s
		if got := Status(snap, true); got != (agentcheck.Status{Health: agentcheck.Draining, State: "napd stopping", QueueDepth: 3}) {
			t.Errorf("%s while stopping: %+v", s, got)
		}
	}
	room := model.Snapshot{Lifecycle: lifecycle.Snapshot{State: lifecycle.Waking, RoomWait: true}}
	if got := Status(room, false); got.Health != agentcheck.Draining || got.State != "waiting for room" {
		t.Errorf("waking for room: %+v", got)
	}
}
