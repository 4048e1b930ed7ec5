package control

import "testing"

// Every subscriber gets what is published while it subscribes; a full one
// loses events instead of blocking the publisher; one that left gets none.
func TestHub_FanOutDropsForTheSlow(t *testing.T) {
	h := NewHub()
	fast, endFast := h.Subscribe()
	slow, endSlow := h.Subscribe()
	defer endSlow()
	for i := range 300 {
		h.Publish(Event{Model: "m", Kind: EventState, WakeMs: int64(i)})
		<-fast
	}
	if n := len(slow); n != 256 {
		t.Errorf("the slow subscriber holds %d events, want its 256 buffered", n)
	}
	endFast()
	endFast() // twice is harmless
	h.Publish(Event{Kind: EventReload})
	select {
	case e := <-fast:
		t.Errorf("an ended subscription got %+v", e)
	default:
	}
}
