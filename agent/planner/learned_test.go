package planner

import (
	"testing"
	"time"
)

func TestRecent_TypicalIsTheMedianOfTheLastEight(t *testing.T) {
	var r Recent
	if r.Typical() != 0 {
		t.Fatal("empty Recent has a typical duration")
	}
	r.Add(4 * time.Second)
	if got := r.Typical(); got != 4*time.Second {
		t.Fatalf("typical = %s", got)
	}
	r.Add(time.Minute) // one outlier does not swing it
	r.Add(5 * time.Second)
	if got := r.Typical(); got != 5*time.Second {
		t.Fatalf("typical = %s, want 5s", got)
	}
	for range 8 { // the old ones roll out
		r.Add(time.Second)
	}
	if got := r.Typical(); got != time.Second {
		t.Fatalf("typical = %s, want 1s after eight 1s", got)
	}
}
