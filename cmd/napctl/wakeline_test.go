package main

import (
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
)

func TestWakeLine(t *testing.T) {
	frac, left := 0.43, int64(12_000)
	for _, tc := range []struct {
		name string
		load *control.LoadProgress
		want string
		step int
	}{
		{"no load measured", nil, "m: waking 5.2s", -1},
		{"fraction and time left", &control.LoadProgress{ReadBytes: 7 << 30, WeightBytes: 16 << 30, Progress: &frac, LeftMs: &left},
			"m: waking [########------------] 43 % (7.0 of 16.0 GiB), about 12 s left, 5.2s", 4},
		{"weights unknown", &control.LoadProgress{ReadBytes: 3 << 29}, "m: waking, 1.5 GiB read, 5.2s", -1},
	} {
		if got := wakeLine("m", "waking", tc.load, 5200*time.Millisecond); got != tc.want {
			t.Errorf("%s: wakeLine = %q, want %q", tc.name, got, tc.want)
		}
		if got := loadStep(tc.load); got != tc.step {
			t.Errorf("%s: loadStep = %d, want %d", tc.name, got, tc.step)
		}
	}
}

func TestEventLine_Load(t *testing.T) {
	frac := 0.5
	e := control.Event{Time: time.Date(2026, 12, 7, 9, 8, 10, 0, time.Local), Model: "m", Kind: control.EventLoad,
		Load: &control.LoadProgress{ReadBytes: 1 << 30, WeightBytes: 2 << 30, Progress: &frac}}
	if got, want := eventLine(e), "09:08:10.000 m load 50 % (1.0 of 2.0 GiB)"; got != want {
		t.Errorf("eventLine = %q, want %q", got, want)
	}
}
