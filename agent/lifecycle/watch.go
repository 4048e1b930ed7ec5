package lifecycle

import "time"

// Watch decides when an awake engine counts as hung: health_failures
// health probes in a row failed, and its evidence showed no progress
// meanwhile (token counters, bytes it sent). An engine busy with a long
// generation may not answer its health path, but its counters move, so it
// is never taken for hung. Like Machine it owns no clock: the owner loop
// asks Due on its ticks, probes, and reports with Probed.
type Watch struct {
	interval time.Duration // 0: awake engines are not probed
	failures int
	next     time.Time
	failed   int
}

// NewWatch returns a Watch probing every interval (health_interval; 0
// never) and giving up after failures (health_failures; < 1 is 1).
func NewWatch(interval time.Duration, failures int) *Watch {
	return &Watch{interval: interval, failures: max(failures, 1)}
}

// Reset starts watching afresh at now, e.g. once a wake is verified: the
// first probe is due an interval later, with no failure counted.
func (w *Watch) Reset(now time.Time) {
	w.next = now.Add(w.interval)
	w.failed = 0
}

// Due reports whether a probe is due at now. Probing then is the caller's
// job; Probed moves the next one on.
func (w *Watch) Due(now time.Time) bool {
	return w.interval > 0 && !now.Before(w.next)
}

// Hasten makes a probe due at now, ahead of the interval: a request that
// could not connect to the engine is a reason to look at once. Probes that
// are off (interval 0) stay off.
func (w *Watch) Hasten(now time.Time) {
	if w.interval > 0 && now.Before(w.next) {
		w.next = now
	}
}

// Timeout is how long one probe may take: half the interval, so a probe
// ends before the next is due, and at most 10 s.
func (w *Watch) Timeout() time.Duration {
	return min(max(w.interval/2, 100*time.Millisecond), 10*time.Second)
}

// Probed records a probe sent at sent: whether the engine answered
// healthy, and whether its evidence moved since the previous probe. It
// returns how many probes failed in a row without progress, and hung once
// that reaches the limit (the count then starts again).
func (w *Watch) Probed(sent time.Time, healthy, progressed bool) (failed int, hung bool) {
	w.next = sent.Add(w.interval)
	if healthy || progressed {
		w.failed = 0
		return 0, false
	}
	w.failed++
	if w.failed >= w.failures {
		failed, w.failed = w.failed, 0
		return failed, true
	}
	return w.failed, false
}
