package fakeclock

import (
	"testing"
	"time"
)

func fired(ch <-chan time.Time) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A timer fires once the clock reaches it, not before, and only once.
func TestClock_After(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	c := New(t0)
	soon, later := c.After(time.Second), c.After(time.Minute)
	if !fired(c.After(0)) {
		t.Error("After(0) did not fire at once")
	}
	c.Advance(999 * time.Millisecond)
	if fired(soon) || fired(later) {
		t.Fatal("a timer fired early")
	}
	c.Advance(time.Millisecond)
	if !fired(soon) || fired(later) {
		t.Fatal("the 1s timer did not fire at 1s, or the 1m one did")
	}
	c.Advance(time.Hour)
	if fired(soon) || !fired(later) {
		t.Fatal("a timer fired twice, or the 1m one not at all")
	}
	if got := c.Now(); !got.Equal(t0.Add(time.Hour + time.Second)) {
		t.Errorf("Now = %v", got)
	}
}
