// Package heapfloor keeps Go's heap goal from a busy process's small live
// heap: while napd proxies thousands of requests a second its live heap
// is about a megabyte, and the runtime's goal for it, twice that or 4 MiB
// at the least, has it collect dozens of times a second, each collection
// scanning every goroutine's stack; a tenth of napd's own CPU per request
// went to it (docs/bench.md). A floor under the goal while the heap grows
// fast makes collections rarer; the floor is lifted when it grows slowly,
// so that an idle napd keeps a small heap.
//
// The goal is set through GOGC (debug.SetGCPercent), after each
// collection: Go has no floor of its own (GOMEMLIMIT is a ceiling), and
// a heap kept alive to raise the goal (a "ballast") would be counted by
// every memory figure that reads the heap.
package heapfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
	"time"
)

// heapMinimum is the runtime's least heap goal at GOGC=100 (its
// defaultHeapMinimum); it scales with GOGC, so a GOGC past base raises the
// least goal too.
const heapMinimum = 4 << 20

// BusyRate is the allocation rate, in bytes a second, from which the floor
// holds: at base GOGC a heap growing slower collects less than about once
// a second, which costs nothing worth a larger heap.
const BusyRate = 4 << 20

// Base is the GOGC the runtime took from the environment's value env, as
// it reads it: 100 when unset or not a number, -1 when "off".
func Base(env string) int {
	if env == "off" {
		return -1
	}
	if n, err := strconv.Atoi(env); err == nil {
		return n
	}
	return 100
}

// Percent is the GOGC that makes the heap goal about floor: for a live
// heap of live bytes growing by rate bytes a second, given base, the GOGC
// napd runs with otherwise. base where the goal at base is floor or more
// already, or the heap grows slower than BusyRate.
func Percent(base int, floor, live uint64, rate float64) int {
	if base <= 0 || floor == 0 || rate < BusyRate {
		return base
	}
	if live == 0 {
		live = 1
	}
	// The goal is the larger of live×(1+GOGC/100) and
	// heapMinimum×GOGC/100: the GOGC below makes neither pass floor.
	byLive := (float64(floor)/float64(live) - 1) * 100
	byMinimum := float64(floor) / heapMinimum * 100
	p := int(min(byLive, byMinimum))
	return max(base, p)
}

// Floor sets the GOGC of each collection by Percent, after the last.
type Floor struct {
	base  int
	floor uint64

	mu      sync.Mutex
	stopped bool
	percent int       // set last
	at      time.Time // the last collection's callback
	allocs  uint64    // /gc/heap/allocs:bytes then
	samples [2]metrics.Sample
}

// Start keeps the heap goal at floor bytes or more while the heap grows
// fast; base is the GOGC otherwise (GOGC=off: 0 or less, in which case
// Start does nothing). Stop ends it and puts base back.
func Start(base int, floor uint64) *Floor {
	f := &Floor{base: base, floor: floor, percent: base, at: time.Now()}
	f.samples[0].Name = "/gc/heap/live:bytes"
	f.samples[1].Name = "/gc/heap/allocs:bytes"
	if base <= 0 || floor == 0 {
		f.stopped = true
		return f
	}
	metrics.Read(f.samples[:])
	f.allocs = f.samples[1].Value.Uint64()
	f.arm()
	return f
}

// sentinel is an object made to be collected: its cleanup runs after each
// collection. It holds a pointer so that the tiny allocator, whose
// objects may never be collected one by one, does not place it.
type sentinel struct{ _ *byte }

func (f *Floor) arm() {
	runtime.AddCleanup(new(sentinel), (*Floor).collected, f)
}

// collected runs after a collection: it sets the next goal and waits for
// the next collection.
func (f *Floor) collected() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	now := time.Now()
	metrics.Read(f.samples[:])
	live, allocs := f.samples[0].Value.Uint64(), f.samples[1].Value.Uint64()
	rate := 0.0
	if d := now.Sub(f.at).Seconds(); d > 0 {
		rate = float64(allocs-f.allocs) / d
	}
	f.at, f.allocs = now, allocs
	if p := Percent(f.base, f.floor, live, rate); p != f.percent {
		f.percent = p
		debug.SetGCPercent(p)
	}
	f.arm()
}

// Stop ends the floor and puts base back as GOGC.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	if f.percent != f.base {
		debug.SetGCPercent(f.base)
	}
}
