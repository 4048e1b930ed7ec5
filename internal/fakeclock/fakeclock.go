// Package fakeclock is a clock for tests that only the test moves: code
// under test is handed its Now (and After, for timers on it), and the test
// calls Advance, so timing logic is tested without sleeping.
//
// It is for tests only: production code takes a func() time.Time (and a
// func(time.Duration) <-chan time.Time where it waits) and must not import
// it.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a hand-advanced clock, safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []timer // not fired yet
}

type timer struct {
	at time.Time
	ch chan time.Time
}

// New is a clock at start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After is time.After on the clock: the channel receives the clock's time
// once Advance has moved it d or more past now (at once when d <= 0).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, timer{at: c.now.Add(d), ch: ch})
	return ch
}

// Advance moves the clock forward by d and fires the timers due by then.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	left := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			left = append(left, t)
			continue
		}
		t.ch <- c.now
	}
	clear(c.timers[len(left):])
	c.timers = left
}
