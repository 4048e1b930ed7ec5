// Package loadprogress works out how far a waking engine's load got and
// when it should end, from readings of the bytes its processes read
// (probes/procio) against the size of the model's weight files, and the
// model's learned wake time. It is pure: the readings, their times and
// the sizes come from the caller (docs/lifecycle.md#load-progress).
package loadprogress

import (
	"fmt"
	"time"
)

// Counts is what each of an engine's processes has read so far, in bytes
// (rchar), by pid.
type Counts map[int]uint64

// Read is what the processes in now read since base: per pid, its count
// less its count in base. A pid whose count went down is a new process
// that reuses the number: all it read counts.
func Read(base, now Counts) int64 {
	var total uint64
	for pid, n := range now {
		if b, ok := base[pid]; ok && b <= n {
			n -= b
		}
		total += n
	}
	return int64(min(total, 1<<62))
}

// Load is one wake attempt's load as measured so far. Its zero value is
// not used: Start makes one.
type Load struct {
	start   time.Time
	weights int64         // bytes of weight files; 0: unknown
	learned time.Duration // the model's typical wake; 0: none learned
	tail    time.Duration // the model's typical time from its last weight byte to serving; 0: none learned
	base    Counts
	full    time.Time // the first reading that found all the weights read; zero before
	read    int64     // the most read since start: a process that exits takes its count along
	moved   time.Time // when read last grew (start before it did)
	at      time.Time // the last reading
	known   bool      // the last reading could be taken
}

// Learned is what napd learned of a model's recent wakes: their typical
// duration, and the typical time from the last byte of the weights read
// to serving (the engine's set-up after its weights: CUDA graphs, a
// warm-up); zero: none learned.
type Learned struct {
	Wake, Tail time.Duration
}

// Start begins measuring a load at at: base is what the engine's
// processes had read then (nil when none ran), weights the size of the
// model's weight files (0: unknown).
func Start(at time.Time, weights int64, learned Learned, base Counts) *Load {
	return &Load{start: at, weights: weights, learned: learned.Wake, tail: learned.Tail, base: base, moved: at, at: at}
}

// Observe takes a reading at at; ok is false when the processes could
// not be read at all (progress then is unknown, not stalled).
func (l *Load) Observe(at time.Time, now Counts, ok bool) {
	l.at, l.known = at, ok
	if !ok {
		return
	}
	if r := Read(l.base, now); r > l.read {
		l.read, l.moved = r, at
	}
	if l.full.IsZero() && l.weights > 0 && l.read >= l.weights {
		l.full = at
	}
}

// Tail is how long the wake took from its last weight byte read to end,
// the engine serving; ok is false when no reading found all the weights
// read. Readings a second apart make it up to a second short.
func (l *Load) Tail(end time.Time) (time.Duration, bool) {
	if l.full.IsZero() {
		return 0, false
	}
	return end.Sub(l.full), true
}

// minFraction is the least progress the observed rate is trusted from:
// below it, an engine's first reads (its own libraries) say little.
const minFraction = 0.01

// Status is a load's progress as of its last reading.
type Status struct {
	Read    int64 // bytes read since the load started
	Weights int64 // bytes of the weight files; 0: unknown
	// Fraction is Read over Weights, at most 1; HaveFraction is false
	// when the weights' size is unknown or no reading was taken.
	Fraction     float64
	HaveFraction bool
	// Left is how long the wake should still take; HaveLeft is false
	// when neither progress nor a learned wake time says.
	Left     time.Duration
	HaveLeft bool
	Elapsed  time.Duration // since the load started, at the last reading
}

// Status is the load's progress as of its last reading.
func (l *Load) Status() Status {
	s := Status{Read: l.read, Weights: l.weights, Elapsed: l.at.Sub(l.start)}
	if l.known && l.weights > 0 {
		s.Fraction, s.HaveFraction = min(float64(l.read)/float64(l.weights), 1), true
	}
	tail := l.tail
	if !l.full.IsZero() {
		tail = max(tail-l.at.Sub(l.full), 0)
	}
	s.Left, s.HaveLeft = Left(s.Elapsed, l.learned, tail, s.Fraction, s.HaveFraction)
	return s
}

// Left is how long a load that has run for elapsed and got fraction of
// the way (when haveFraction) should still take, given the model's
// learned wake time (0: none) and what is left of its learned tail (the
// set-up after the weights; 0: none). The time left is estimated twice:
// at the rate so far, elapsed × (1 - fraction) / fraction (from
// minFraction on), plus the tail; and as what the learned wake has left,
// learned - elapsed. They are blended as fraction × the first + (1 -
// fraction) × the second, so the learned time leads early and the
// measured rate by the end. With one of the two, that one; with neither,
// ok is false. It is never below zero.
func Left(elapsed, learned, tail time.Duration, fraction float64, haveFraction bool) (left time.Duration, ok bool) {
	observed := haveFraction && fraction >= minFraction
	var rate float64
	if observed {
		rate = float64(elapsed)*(1-fraction)/fraction + float64(tail)
	}
	rest := float64(max(learned-elapsed, 0))
	switch {
	case observed && learned > 0:
		return time.Duration(fraction*rate + (1-fraction)*rest), true
	case observed:
		return time.Duration(rate), true
	case learned > 0:
		return time.Duration(rest), true
	}
	return 0, false
}

// Stalled reports whether the load has shown no progress for timeout at
// now (timeout 0: never). A load whose last reading could not be taken
// is not stalled (its progress is unknown), nor one that read all its
// weights (what is left, such as a GPU's warm-up, reads nothing).
func (l *Load) Stalled(now time.Time, timeout time.Duration) bool {
	if timeout <= 0 || !l.known || (l.weights > 0 && l.read >= l.weights) {
		return false
	}
	return now.Sub(l.moved) >= timeout
}

// Quiet is how long the load has shown no progress at now.
func (l *Load) Quiet(now time.Time) time.Duration { return now.Sub(l.moved) }

// Text says the progress of model's load in words, for the comments of
// a stream waiting for it: "demo-large loading 43 % (7.1 of 16.4 GiB),
// about 12 s left".
func (s Status) Text(model string) string {
	var t string
	switch {
	case s.HaveFraction:
		u := unitOf(s.Weights)
		t = fmt.Sprintf("%s loading %d %% (%.1f of %.1f %s)", model, int(s.Fraction*100), u.of(s.Read), u.of(s.Weights), u.name)
	case s.Read > 0:
		u := unitOf(s.Read)
		t = fmt.Sprintf("%s loading, %.1f %s read", model, u.of(s.Read), u.name)
	default:
		t = model + " loading"
	}
	if s.HaveLeft {
		t += fmt.Sprintf(", about %d s left", int((s.Left + time.Second/2).Seconds()))
	}
	return t
}

// unit is a binary unit of bytes: GiB for weights of a GiB or more (as
// models come), MiB below.
type unit struct {
	name  string
	bytes float64
}

func unitOf(b int64) unit {
	if b >= 1<<30 {
		return unit{"GiB", 1 << 30}
	}
	return unit{"MiB", 1 << 20}
}

func (u unit) of(b int64) float64 { return float64(b) / u.bytes }

// Wire is a Status as napd's APIs show it: events, napctl status and
// wake, the napd object of /v1/models. It says the bytes the engine's
// processes read since the wake started, over the size of the model's
// weight files when napd knows it, and the time the wake should still
// take when napd can say.
type Wire struct {
	ReadBytes   int64 `json:"read_bytes"`
	WeightBytes int64 `json:"weight_bytes,omitempty"`
	// Progress is ReadBytes over WeightBytes, from 0 to 1; absent when
	// the weights' size is unknown.
	Progress *float64 `json:"progress,omitempty"`
	// LeftMs is the time the wake should still take; absent when neither
	// progress nor a learned wake time says.
	LeftMs *int64 `json:"left_ms,omitempty"`
}

// Wire is s on the wire.
func (s Status) Wire() *Wire {
	w := &Wire{ReadBytes: s.Read, WeightBytes: s.Weights}
	if s.HaveFraction {
		w.Progress = &s.Fraction
	}
	if s.HaveLeft {
		ms := s.Left.Milliseconds()
		w.LeftMs = &ms
	}
	return w
}

// Status is w as a Status again (without Elapsed), for those that show
// it: the status page, napctl.
func (w Wire) Status() Status {
	s := Status{Read: w.ReadBytes, Weights: w.WeightBytes}
	if w.Progress != nil {
		s.Fraction, s.HaveFraction = *w.Progress, true
	}
	if w.LeftMs != nil {
		s.Left, s.HaveLeft = time.Duration(*w.LeftMs)*time.Millisecond, true
	}
	return s
}
