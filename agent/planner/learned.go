package planner

import (
	"slices"
	"time"
)

// Recent keeps the last few durations of one kind (a model's wakes, its
// requests) and tells the typical one, their median, so one outlier does
// not swing Retry-After or a yield. The zero value is empty. It is not safe
// for concurrent use: its owner serialises calls.
type Recent struct {
	last [8]time.Duration
	n    int // how many of last are filled
	next int // where the next one goes
}

// Add records one duration.
func (r *Recent) Add(d time.Duration) {
	r.last[r.next] = d
	r.next = (r.next + 1) % len(r.last)
	r.n = min(r.n+1, len(r.last))
}

// Typical is the median of the recorded durations (the upper one of an even
// count); 0 when none was recorded.
func (r *Recent) Typical() time.Duration {
	if r.n == 0 {
		return 0
	}
	// A copy on the stack: it runs twice for every request's start and end.
	var buf [len(r.last)]time.Duration
	s := buf[:r.n]
	copy(s, r.last[:r.n])
	slices.Sort(s)
	return s[len(s)/2]
}
