package heapfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name        string
		base        int
		floor, live uint64
		rate        float64
		want        int
	}{
		// A megabyte live, growing fast: the least goal (4 MiB×GOGC/100)
		// makes the floor.
		{"busy, small heap", 100, 32 * mib, 1 * mib, 70 * mib, 800},
		// 10 MiB live: 10×(1+220/100) = 32.
		{"busy, heap near the floor", 100, 32 * mib, 10 * mib, 70 * mib, 220},
		{"busy, heap past the floor", 100, 32 * mib, 20 * mib, 70 * mib, 100},
		{"slow growth", 100, 32 * mib, 1 * mib, BusyRate - 1, 100},
		{"the operator's GOGC above", 1000, 32 * mib, 1 * mib, 70 * mib, 1000},
		{"GOGC=off", -1, 32 * mib, 1 * mib, 70 * mib, -1},
		{"no floor", 100, 0, 1 * mib, 70 * mib, 100},
		{"nothing live yet", 100, 32 * mib, 0, 70 * mib, 800},
	} {
		if got := Percent(c.base, c.floor, c.live, c.rate); got != c.want {
			t.Errorf("%s: Percent = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestBase(t *testing.T) {
	for env, want := range map[string]int{"": 100, "off": -1, "50": 50, "x": 100} {
		if got := Base(env); got != want {
			t.Errorf("Base(%q) = %d, want %d", env, got, want)
		}
	}
}

func gogc() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

var sink []byte

// A heap growing fast, as a busy napd's, gets the floor after a
// collection; Stop puts the GOGC back.
func TestFloor(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	f := Start(100, 32<<20)
	deadline := time.Now().Add(20 * time.Second)
	for gogc() != 800 {
		if time.Now().After(deadline) {
			f.Stop()
			t.Fatalf("GOGC %d after collections of a fast-growing heap, want 800", gogc())
		}
		for range 64 {
			sink = make([]byte, 64<<10) // 4 MiB a round, within microseconds
		}
		runtime.GC()
		runtime.Gosched() // the cleanup's goroutine
	}
	f.Stop()
	if got := gogc(); got != 100 {
		t.Errorf("GOGC %d after Stop, want 100", got)
	}
	f.Stop() // again: nothing
}

// GOGC=off (base 0 or less) or no floor: Start changes nothing.
func TestFloorOff(t *testing.T) {
	for _, f := range []*Floor{Start(-1, 32<<20), Start(100, 0)} {
		if !f.stopped {
			t.Error("started")
		}
		f.Stop()
	}
}
