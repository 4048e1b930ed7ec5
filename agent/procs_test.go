package agent

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/napd/napd/agent/config"
)

func TestProcs(t *testing.T) {
	for _, c := range []struct {
		name        string
		cpus, avail int
		envSet      bool
		want        int
	}{
		{"one CPU", 0, 1, false, 1},
		{"two CPUs: two threads", 0, 2, false, 2},
		{"three CPUs: rounded up", 0, 3, false, 2},
		{"four CPUs: half", 0, 4, false, 2},
		{"five CPUs: rounded up", 0, 5, false, 3},
		{"64 CPUs: half", 0, 64, false, 32},
		{"no CPU found: one", 0, 0, false, 1},
		{"GOMAXPROCS from the environment stands", 0, 2, true, 2},
		{"agent.cpus wins over everything", 6, 2, true, 6},
		{"agent.cpus past the CPUs is the operator's choice", 8, 4, false, 8},
	} {
		if got := Procs(c.cpus, c.envSet, c.avail); got != c.want {
			t.Errorf("%s: Procs(%d, %v, %d) = %d, want %d", c.name, c.cpus, c.envSet, c.avail, got, c.want)
		}
	}
}

// agent.heap_floor starts a floor, a reload to 0 ends it, and napd's
// stop puts GOGC back; an agent that may not tune the runtime (a test's)
// starts none.
func TestSetHeapFloor(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC set in the environment")
	}
	withFloor, without := config.Default(), config.Default()
	without.Agent.HeapFloor = 0
	a := &Agent{opts: Options{TuneRuntime: true}}
	a.setHeapFloor(withFloor)
	if a.heapFloor == nil {
		t.Fatal("no floor with agent.heap_floor set")
	}
	a.setHeapFloor(without)
	if a.heapFloor != nil {
		t.Fatal("a floor with agent.heap_floor = 0")
	}
	a.setHeapFloor(withFloor)
	a.setHeapFloor(nil)
	if a.heapFloor != nil || debug.SetGCPercent(100) != 100 {
		t.Fatal("the floor or its GOGC outlived napd's stop")
	}
	embedded := &Agent{}
	if embedded.setHeapFloor(withFloor); embedded.heapFloor != nil {
		t.Fatal("an agent that may not tune the runtime started a floor")
	}
}
