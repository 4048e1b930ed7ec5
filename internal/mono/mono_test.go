package mono

import (
	"testing"
	"time"
)

func TestReadingsAreTimes(t *testing.T) {
	before := time.Now()
	d := Now()
	after := time.Now()
	if at := Time(d); at.Before(before) || at.After(after) {
		t.Errorf("Time(Now()) = %v, want between %v and %v", at, before, after)
	}
	if Of(Time(d)) != d {
		t.Errorf("Of(Time(%v)) = %v", d, Of(Time(d)))
	}
}
