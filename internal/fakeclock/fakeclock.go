// Package fakeclock is a clock for tests that only the test moves: code
// under test is handed its Now, and the test calls Advance, so timing
// logic is tested without sleeping.
//
// It is for tests only: production code takes a func() time.Time and must
// not import it.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a hand-advanced clock, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New is a clock at start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
