package lifecycle

import (
	"testing"
	"time"
)

func TestWatch_HungAfterFailuresWithoutProgress(t *testing.T) {
	t0 := time.Unix(0, 0)
	w := NewWatch(10*time.Second, 3)
	w.Reset(t0)
	if w.Due(t0.Add(9 * time.Second)) {
		t.Fatal("due before an interval passed")
	}
	now := t0.Add(10 * time.Second)
	for i := 1; i <= 3; i++ {
		if !w.Due(now) {
			t.Fatalf("probe %d not due at %v", i, now.Sub(t0))
		}
		failed, hung := w.Probed(now, false, false)
		if failed != i || hung != (i == 3) {
			t.Fatalf("probe %d: failed %d hung %v", i, failed, hung)
		}
		if w.Due(now.Add(9 * time.Second)) {
			t.Fatal("the next probe is due before an interval")
		}
		now = now.Add(10 * time.Second)
	}
	// Detected 30 s after the last healthy state: interval × failures.
}

func TestWatch_ProgressOrHealthResets(t *testing.T) {
	now := time.Unix(0, 0)
	w := NewWatch(time.Second, 2)
	w.Reset(now)
	for i := range 100 { // a long generation: health fails, counters move
		if _, hung := w.Probed(now.Add(time.Duration(i)*time.Second), false, true); hung {
			t.Fatalf("hung at probe %d while the engine progressed", i)
		}
	}
	w.Probed(now, false, false)
	if _, hung := w.Probed(now, true, false); hung {
		t.Fatal("a healthy answer counts as a failure")
	}
	if failed, hung := w.Probed(now, false, false); failed != 1 || hung {
		t.Fatalf("after a healthy probe: failed %d, hung %v; want the count restarted", failed, hung)
	}
}

func TestWatch_OffAndBounds(t *testing.T) {
	w := NewWatch(0, 3)
	if w.Due(time.Unix(1<<40, 0)) {
		t.Error("health_interval 0 probes")
	}
	if got := NewWatch(time.Minute, 3).Timeout(); got != 10*time.Second {
		t.Errorf("timeout for 1m = %v, want the 10s cap", got)
	}
	if got := NewWatch(time.Second, 3).Timeout(); got != 500*time.Millisecond {
		t.Errorf("timeout for 1s = %v, want half", got)
	}
	if _, hung := NewWatch(time.Second, 0).Probed(time.Unix(0, 0), false, false); !hung {
		t.Error("health_failures below 1 counts as 1")
	}
}

// Hasten makes a probe due at once; probes that are off stay off.
func TestWatch_Hasten(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	w := NewWatch(time.Minute, 3)
	w.Reset(t0)
	if w.Due(t0.Add(time.Second)) {
		t.Fatal("due before the interval")
	}
	w.Hasten(t0.Add(time.Second))
	if !w.Due(t0.Add(time.Second)) {
		t.Error("not due after Hasten")
	}
	off := NewWatch(0, 3)
	off.Hasten(t0)
	if off.Due(t0) {
		t.Error("Hasten turned probes on")
	}
}
