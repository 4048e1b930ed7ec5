package model

import (
	"context"
	"sync"
	"testing"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// A state event finds its state published: whoever it wakes (the router
// API's event stream reads the listing) reads the new state, not the one
// before.
func TestEvents_StatePublishedFirst(t *testing.T) {
	var mu sync.Mutex
	var stale []string
	var r *rig
	r = newRigWith(t, supervisor.Stopped, nil, func(d *Deps) {
		emit := d.Emit
		d.Emit = func(e control.Event) {
			if e.Kind == control.EventState && r != nil && r.m != nil {
				if got := r.m.Snapshot().Lifecycle.State.String(); got != e.To {
					mu.Lock()
					stale = append(stale, e.To+" announced while "+got+" was published")
					mu.Unlock()
				}
			}
			emit(e)
		}
	})
	a := r.admit(context.Background())
	r.next("wake").reply <- nil
	r.granted(a).Done(gateway.Outcome{})
	slept := r.operatorSleep()
	r.next("sleep").reply <- nil
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	r.sync()
	mu.Lock()
	defer mu.Unlock()
	if len(stale) > 0 {
		t.Errorf("state events before their state was published: %q", stale)
	}
}
