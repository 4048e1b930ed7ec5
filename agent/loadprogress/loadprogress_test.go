package loadprogress

import (
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name      string
		base, now Counts
		want      int64
	}{
		{"fresh processes count whole", nil, Counts{10: 500, 11: 20}, 520},
		{"baseline taken off", Counts{10: 100}, Counts{10: 500}, 400},
		{"a process gone from now reads nothing", Counts{10: 100, 12: 9}, Counts{10: 150}, 50},
		{"a pid reused by a new process counts whole", Counts{10: 900}, Counts{10: 30}, 30},
		{"nothing", Counts{10: 1}, Counts{}, 0},
	} {
		if got := Read(tc.base, tc.now); got != tc.want {
			t.Errorf("%s: Read = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestLeft(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		name     string
		elapsed  time.Duration
		learned  time.Duration
		tail     time.Duration
		fraction float64
		have     bool
		want     time.Duration
		ok       bool
	}{
		{"nothing known", 5 * s, 0, 0, 0, false, 0, false},
		{"learned only", 5 * s, 20 * s, 0, 0, false, 15 * s, true},
		{"learned only, past it", 25 * s, 20 * s, 0, 0, false, 0, true},
		{"rate only: a quarter in 10 s leaves 30 s", 10 * s, 0, 0, 0.25, true, 30 * s, true},
		{"rate below minFraction is not trusted", 10 * s, 0, 0, 0.001, true, 0, false},
		{"below minFraction, learned leads", 10 * s, 40 * s, 0, 0.001, true, 30 * s, true},
		// rate says 10 s, learned says 30 s: 0.5×10 + 0.5×30.
		{"half way, blended", 10 * s, 40 * s, 0, 0.5, true, 20 * s, true},
		// rate says 10×0.25/0.75 = 3.33 s; learned 90 s: 0.75×3.33 + 0.25×90 = 25 s.
		{"late, the rate leads", 10 * s, 100 * s, 0, 0.75, true, 25 * s, true},
		{"all read", 10 * s, 100 * s, 0, 1, true, 0, true},
		// The rate's 30 s plus a learned 4 s set-up after the weights.
		{"rate and tail", 10 * s, 0, 4 * s, 0.25, true, 34 * s, true},
		{"all read, tail left", 10 * s, 0, 3 * s, 1, true, 3 * s, true},
	} {
		got, ok := Left(tc.elapsed, tc.learned, tc.tail, tc.fraction, tc.have)
		if ok != tc.ok || (got-tc.want).Abs() > time.Millisecond {
			t.Errorf("%s: Left = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestLoad_ProgressAndStall(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	const gib = 1 << 30
	l := Start(t0, 4*gib, Learned{}, Counts{7: 1000})
	if l.Stalled(t0.Add(time.Hour), 0) {
		t.Fatal("timeout 0 stalls")
	}
	if st := l.Status(); st.HaveFraction || st.HaveLeft {
		t.Fatalf("before any reading: %+v, want nothing known", st)
	}
	l.Observe(t0.Add(10*time.Second), Counts{7: 1000 + gib, 8: 0}, true)
	st := l.Status()
	if st.Read != gib || !st.HaveFraction || st.Fraction != 0.25 || !st.HaveLeft || st.Left != 30*time.Second {
		t.Fatalf("a quarter in 10 s: %+v", st)
	}
	if got := st.Text("demo-large"); got != "demo-large loading 25 % (1.0 of 4.0 GiB), about 30 s left" {
		t.Fatalf("Text = %q", got)
	}
	// The reading process exits: its count leaves, progress stays.
	l.Observe(t0.Add(20*time.Second), Counts{8: 100}, true)
	if st := l.Status(); st.Read != gib {
		t.Fatalf("after the reader exited: read %d, want %d kept", st.Read, gib)
	}
	if l.Stalled(t0.Add(29*time.Second), 20*time.Second) || !l.Stalled(t0.Add(30*time.Second), 20*time.Second) {
		t.Fatal("want stalled 20 s after the last growth (at 10 s), not before")
	}
	// Unreadable: unknown, not stalled.
	l.Observe(t0.Add(31*time.Second), nil, false)
	if l.Stalled(t0.Add(time.Hour), 20*time.Second) || l.Status().HaveFraction {
		t.Fatal("an unreadable load is stalled or has a fraction")
	}
	// All weights read: what is left reads nothing, and is not a stall.
	l.Observe(t0.Add(40*time.Second), Counts{8: 5 * gib}, true)
	if st := l.Status(); st.Fraction != 1 || l.Stalled(t0.Add(time.Hour), 20*time.Second) {
		t.Fatalf("all read: %+v, stalled %v", st, l.Stalled(t0.Add(time.Hour), 20*time.Second))
	}
	if tail, ok := l.Tail(t0.Add(45 * time.Second)); !ok || tail != 5*time.Second {
		t.Fatalf("Tail = %v, %v; want 5 s from the reading that found all read", tail, ok)
	}
}

// A learned tail counts down once the weights are read.
func TestLoad_TailCountsDown(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	l := Start(t0, 100, Learned{Tail: 4 * time.Second}, nil)
	if _, ok := l.Tail(t0); ok {
		t.Fatal("a tail before all was read")
	}
	l.Observe(t0.Add(10*time.Second), Counts{1: 100}, true)
	l.Observe(t0.Add(11*time.Second), Counts{1: 100}, true)
	if st := l.Status(); !st.HaveLeft || st.Left != 3*time.Second {
		t.Fatalf("a second after the last byte: %+v, want 3 s of the 4 s tail left", st)
	}
}

func TestStatus_Text(t *testing.T) {
	for _, tc := range []struct {
		s    Status
		want string
	}{
		{Status{}, "m loading"},
		{Status{Read: 3 << 29}, "m loading, 1.5 GiB read"},
		{Status{Read: 12 << 20, Weights: 48 << 20, Fraction: 0.25, HaveFraction: true}, "m loading 25 % (12.0 of 48.0 MiB)"},
		{Status{Read: 3 << 19}, "m loading, 1.5 MiB read"},
		{Status{Read: 3 << 29, Left: 1400 * time.Millisecond, HaveLeft: true}, "m loading, 1.5 GiB read, about 1 s left"},
		{Status{Read: 7 << 30, Weights: 16 << 30, Fraction: 0.4375, HaveFraction: true, Left: 12 * time.Second, HaveLeft: true},
			"m loading 43 % (7.0 of 16.0 GiB), about 12 s left"},
	} {
		if got := tc.s.Text("m"); got != tc.want {
			t.Errorf("Text(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

func TestWire_RoundTrip(t *testing.T) {
	for _, s := range []Status{
		{Read: 5},
		{Read: 1 << 30, Weights: 4 << 30, Fraction: 0.25, HaveFraction: true},
		{Read: 1 << 30, Left: 1500 * time.Millisecond, HaveLeft: true},
	} {
		w := s.Wire()
		if (w.Progress != nil) != s.HaveFraction || (w.LeftMs != nil) != s.HaveLeft {
			t.Errorf("Wire(%+v) = %+v: optional fields wrong", s, w)
		}
		if got := w.Status(); got != s {
			t.Errorf("Wire(%+v).Status() = %+v", s, got)
		}
	}
}
