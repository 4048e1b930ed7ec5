package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Health polling: the first probe goes out at once, then the pause grows
// from firstProbePause by half each time up to maxProbePause. The cap
// bounds how long a request waiting for the wake is held after the engine
// is ready (the gateway promises under 50 ms); probes on loopback are
// cheap, so a cold start of a minute costing 2,400 of them is fine.
const (
	firstProbePause = 10 * time.Millisecond
	maxProbePause   = 25 * time.Millisecond
	// probeTimeout bounds one probe, so a hung engine does not hold a try.
	probeTimeout = 2 * time.Second
)

// nextProbePause is the pause after one of d.
func nextProbePause(d time.Duration) time.Duration {
	return min(d+d/2, maxProbePause)
}

// probe asks the engine's health path once; a 2xx is healthy.
func (t target) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	path := t.spec.Health
	if path == "" {
		path = "/health"
	}
	_, err := t.get(ctx, path)
	return err
}

// HealthTimeoutError is a wake whose health check did not pass before the
// attempt's deadline. It unwraps to context.DeadlineExceeded.
type HealthTimeoutError struct {
	Within time.Duration // the attempt's whole budget
	Last   error         // the last probe's error; nil if none finished
}

// Error names the budget and the last probe's failure.
func (e *HealthTimeoutError) Error() string {
	last := "none finished"
	if e.Last != nil {
		last = e.Last.Error()
	}
	return fmt.Sprintf("health check did not pass within %s: last error: %s", shortDuration(e.Within), last)
}

// Unwrap makes errors.Is(err, context.DeadlineExceeded) hold.
func (e *HealthTimeoutError) Unwrap() error { return context.DeadlineExceeded }

// verifyHealth polls until the engine answers healthy or ctx ends. start is
// when the attempt began, to say how long it was given.
func (t target) verifyHealth(ctx context.Context, start time.Time) error {
	pause := firstProbePause
	var last error
	for {
		err := t.probe(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil {
			last = err
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				within := time.Since(start)
				if d, ok := ctx.Deadline(); ok {
					within = d.Sub(start)
				}
				return &HealthTimeoutError{Within: within, Last: last}
			}
			return fmt.Errorf("health check cancelled (last error: %v): %w", last, context.Cause(ctx))
		case <-timer.C:
		}
		pause = nextProbePause(pause)
	}
}

// shortDuration writes d rounded to milliseconds, without the zero units
// that Duration.String leaves ("10m" rather than "10m0s").
func shortDuration(d time.Duration) string {
	s := d.Round(time.Millisecond).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
