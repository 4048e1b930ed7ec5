// Package mono reads the monotonic clock alone, for deadlines and
// durations on the request path: time.Now also reads the wall clock, and
// on a virtual machine each read costs about as much.
package mono

import "time"

// epoch is a reading of both clocks; time.Since(epoch) reads the
// monotonic one alone.
var epoch = time.Now()

// Now is the monotonic clock's reading: the time since the process started.
func Now() time.Duration { return time.Since(epoch) }

// Time is the time of reading d, as good a deadline as time.Now's.
func Time(d time.Duration) time.Time { return epoch.Add(d) }

// Of is t as a reading of the monotonic clock.
func Of(t time.Time) time.Duration { return t.Sub(epoch) }
