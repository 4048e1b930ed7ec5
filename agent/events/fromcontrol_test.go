package events_test

import (
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/events"
)

// Only model lifecycle events are published, in the events schema; planner
// decisions and reloads stay on the control socket.
func TestFromControl(t *testing.T) {
	at := time.Unix(1700000000, 0)
	got, ok := events.FromControl(control.Event{Time: at, Model: "m", Kind: "wake", Reason: "woke in 1.5s", WakeMs: 1500})
	want := events.Event{Time: at, Model: "m", Kind: events.KindWake, Reason: "woke in 1.5s", WakeDuration: 1500 * time.Millisecond}
	if !ok || got != want {
		t.Errorf("wake = %+v %v, want %+v", got, ok, want)
	}
	got, ok = events.FromControl(control.Event{Model: "m", Kind: "state", From: "awake", To: "draining", Reason: "idle"})
	if !ok || got.Kind != events.KindState || got.From != "awake" || got.To != "draining" || got.Reason != "idle" {
		t.Errorf("state = %+v %v", got, ok)
	}
	for _, e := range []control.Event{{Model: "m", Kind: "decision"}, {Kind: "reload"}, {Kind: "state"}} {
		if _, ok := events.FromControl(e); ok {
			t.Errorf("%+v is published", e)
		}
	}
}
