package room

import (
	"testing"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/planner"
)

// A holder asked to sleep for a waiting wake is not asked again while
// nothing about it changed, nor while it stays busy (one decision, one log
// line), but at once when it turned idle: a sleep it declined a moment ago
// (its last request was still ending) must not keep the waiting request
// for Reask.
func TestRoomAsksAgainWhenTheHolderChanged(t *testing.T) {
	w := &wait{acted: make(map[string]asked)}
	t0 := time.Unix(1000, 0)
	busy := holderView{engine: planner.EngineIdle, state: lifecycle.Awake, active: 1, lastUsed: t0}
	if !w.ask("a/make-room", t0, busy) {
		t.Fatal("the first ask was not made")
	}
	if w.ask("a/make-room", t0.Add(time.Second), busy) {
		t.Fatal("asked again with nothing changed")
	}
	if !w.ask("b/make-room", t0.Add(time.Second), busy) {
		t.Fatal("another holder was not asked")
	}
	ended := busy
	ended.active, ended.lastUsed = 0, t0.Add(1500*time.Millisecond)
	if !w.ask("a/make-room", t0.Add(2*time.Second), ended) {
		t.Fatal("not asked again after its last request ended")
	}
	if w.ask("a/make-room", t0.Add(3*time.Second), ended) {
		t.Fatal("asked again with nothing changed since the second ask")
	}
	// A busy holder changes with every request it serves: not asked again
	// for that (one decision, one log line), only after Reask.
	busier := busy
	if !w.ask("c/yield", t0, busier) {
		t.Fatal("the first ask of c was not made")
	}
	busier.active, busier.lastUsed = 3, t0.Add(time.Second)
	if w.ask("c/yield", t0.Add(time.Second), busier) {
		t.Fatal("a busy holder was asked again because it served a request")
	}
	if !w.ask("a/make-room", t0.Add(2*time.Second+Reask), ended) {
		t.Fatalf("not asked again after %s", Reask)
	}
}

// A model going idle asks the make-room desk for a round only while a
// wake waits: with nobody waiting, a request's end must not wake the
// desk's goroutine (it was a scheduling delay on every request's path).
func TestRoomModelIdlePokesOnlyWhileWaiting(t *testing.T) {
	r := New(Deps{Clock: time.Now})
	poked := func() bool {
		select {
		case <-r.kick:
			return true
		default:
			return false
		}
	}
	r.ModelIdle()
	if poked() {
		t.Fatal("a model's idleness woke the desk with nobody waiting")
	}
	r.mu.Lock()
	r.waits["b"] = &wait{}
	r.counted()
	r.mu.Unlock()
	r.ModelIdle()
	if !poked() {
		t.Fatal("a model's idleness did not wake the desk while b waits")
	}
	r.mu.Lock()
	delete(r.waits, "b")
	r.counted()
	r.mu.Unlock()
	r.ModelIdle()
	if poked() {
		t.Fatal("the desk was woken after the wait ended")
	}
}
