package priority

import (
	"strings"
	"testing"
	"time"
)

const (
	interactive Class = 1
	dflt        Class = 2
	batch       Class = 3
)

func TestResolve_LowersNeverRaises(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		ceiling, asked, want Class
	}{
		{"no key class, no header: the model's default", None, None, dflt},
		{"the key's class", batch, None, batch},
		{"a header lowers the key's class", interactive, batch, batch},
		{"a header cannot raise it", batch, interactive, batch},
		{"nor raise the model's default", None, interactive, dflt},
		{"but may lower it", None, batch, batch},
		{"the same class", dflt, dflt, dflt},
	} {
		if got := Resolve(tc.ceiling, tc.asked, dflt); got != tc.want {
			t.Errorf("%s: Resolve(%d, %d) = %d, want %d", tc.name, tc.ceiling, tc.asked, got, tc.want)
		}
	}
}

// The starvation bound: one class up per priority_age waited, never
// above the first.
func TestAged_OneClassPerAge(t *testing.T) {
	age := time.Minute
	for _, tc := range []struct {
		c      Class
		waited time.Duration
		want   Class
	}{
		{batch, 0, batch},
		{batch, time.Minute - time.Nanosecond, batch},
		{batch, time.Minute, dflt},
		{batch, 2*time.Minute - 1, dflt},
		{batch, 2 * time.Minute, interactive},
		{batch, time.Hour, interactive},
		{interactive, time.Hour, interactive},
		{None, time.Hour, None},
	} {
		if got := tc.c.Aged(tc.waited, age); got != tc.want {
			t.Errorf("class %d after %s: %d, want %d", tc.c, tc.waited, got, tc.want)
		}
	}
	if got := batch.Aged(time.Hour, 0); got != batch {
		t.Errorf("age 0 aged batch to %d", got)
	}
}

func TestClasses_NamesAndDefault(t *testing.T) {
	cs := DefaultClasses
	if c, ok := cs.Of("batch"); !ok || c != batch || cs.Name(c) != "batch" {
		t.Errorf("batch: %d %v %q", c, ok, cs.Name(c))
	}
	if cs.Default() != dflt || cs.Lowest() != batch {
		t.Errorf("default %d lowest %d", cs.Default(), cs.Lowest())
	}
	if d := (Classes{"high", "low"}).Default(); d != 2 {
		t.Errorf("a list without \"default\" defaults to its lowest, got %d", d)
	}
	if _, err := cs.Parse("urgent"); err == nil || !strings.Contains(err.Error(), "interactive, default, batch") {
		t.Errorf("unknown class: %v", err)
	}
	if cs.Name(None) != "" || cs.Name(9) != "" {
		t.Error("None and out-of-range classes have no name")
	}
	if interactive.Engine() != 0 || batch.Engine() != 2 {
		t.Errorf("engine priorities %d %d, want 0 and 2", interactive.Engine(), batch.Engine())
	}
	if !interactive.Above(batch) || batch.Above(interactive) || !batch.Above(None) || None.Above(batch) {
		t.Error("Above")
	}
	if Best(batch, interactive) != interactive || Best(None, batch) != batch || Best(None, None) != None {
		t.Error("Best")
	}
}

func TestClasses_Check(t *testing.T) {
	for _, tc := range []struct {
		cs  Classes
		bad string
	}{
		{DefaultClasses, ""},
		{Classes{"only"}, ""},
		{Classes{}, "want 1 to 16"},
		{Classes{"a", "a"}, "listed twice"},
		{Classes{"Batch"}, "want a name"},
		{Classes{"a b"}, "want a name"},
		{make(Classes, 17), "want 1 to 16"},
	} {
		err := tc.cs.Check()
		if (tc.bad == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%q: %v, want %q", tc.cs, err, tc.bad)
		}
	}
}

// queue is a test queue in arrival order, one second apart from t0.
func queue(t0 time.Time, reqs ...Queued) func(int) Queued {
	for i := range reqs {
		reqs[i].Arrived = t0.Add(time.Duration(i) * time.Second)
	}
	return func(i int) Queued { return reqs[i] }
}

func TestPick_ClassFirstThenFairShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0.Add(10 * time.Second) // nothing aged (age 1m)
	for _, tc := range []struct {
		name string
		reqs []Queued
		fair bool
		turn string
		want int
	}{
		{"by arrival in one class", []Queued{{Class: dflt, Client: "b"}, {Class: dflt, Client: "a"}}, false, "", 0},
		{"a higher class before older lower ones",
			[]Queued{{Class: batch, Client: "x"}, {Class: batch, Client: "x"}, {Class: interactive, Client: "y"}}, false, "", 2},
		{"the oldest of the higher class",
			[]Queued{{Class: batch}, {Class: interactive, Client: "b"}, {Class: interactive, Client: "a"}}, false, "", 1},
		{"fair share within the class: the client after the last one",
			[]Queued{{Class: interactive, Client: "alice"}, {Class: batch, Client: "bob"}, {Class: interactive, Client: "carol"}}, true, "alice", 2},
		{"fair share wraps to a new round",
			[]Queued{{Class: interactive, Client: "alice"}, {Class: interactive, Client: "bob"}}, true, "carol", 0},
		{"fair share never reaches into a lower class",
			[]Queued{{Class: interactive, Client: "alice"}, {Class: batch, Client: "bob"}}, true, "alice", 0},
	} {
		if got := Pick(len(tc.reqs), queue(t0, tc.reqs...), now, time.Minute, tc.fair, tc.turn); got != tc.want {
			t.Errorf("%s: picked %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A batch request under a steady stream of interactive ones is admitted
// once it has aged to their class: after (3-1) × priority_age, then by
// arrival (it is older) or in its client's turn.
func TestPick_StarvationBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	age := time.Minute
	reqs := []Queued{{Class: batch, Client: "nightly", Arrived: t0}}
	for now := t0; ; now = now.Add(time.Second) {
		// A fresh interactive request arrives every second.
		reqs = append(reqs, Queued{Class: interactive, Client: "ide", Arrived: now})
		at := func(i int) Queued { return reqs[i] }
		i := Pick(len(reqs), at, now, age, false, "")
		if reqs[i].Client == "nightly" {
			if waited := now.Sub(t0); waited != 2*age {
				t.Fatalf("batch admitted after %s, want exactly 2 × priority_age", waited)
			}
			return
		}
		reqs = append(reqs[:i], reqs[i+1:]...)
		if now.Sub(t0) > time.Hour {
			t.Fatal("batch starved")
		}
	}
}

// Oldest keeps each class's oldest arrival; Best is the highest class
// once aged, with the arrival of its oldest request.
func TestOldest_BestAged(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var o Oldest
	if c, _ := o.Best(t0, time.Minute); c != None {
		t.Errorf("empty: %d", c)
	}
	o.Note(batch, t0.Add(time.Second))
	o.Note(batch, t0) // older: kept
	o.Note(batch, t0.Add(2*time.Second))
	o.Note(dflt, t0.Add(30*time.Second))
	o.Note(None, t0)
	if c, at := o.Best(t0.Add(40*time.Second), time.Minute); c != dflt || !at.Equal(t0.Add(30*time.Second)) {
		t.Errorf("at 40s: %d %v, want default from 30s", c, at)
	}
	// At 2m batch's oldest counts as interactive; default's (1m30s) as
	// interactive too: the older arrival is named.
	if c, at := o.Best(t0.Add(2*time.Minute), time.Minute); c != interactive || !at.Equal(t0) {
		t.Errorf("at 2m: %d %v, want interactive from 0s", c, at)
	}
}
