package agent

import (
	"os"
	"runtime"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/internal/heapfloor"
)

// Procs is how many threads run napd's own Go code at once (GOMAXPROCS):
// agent.cpus when set; else GOMAXPROCS from the environment when set
// (avail is then that value); else half of avail, the CPUs the runtime
// found for napd (its cgroup's limit included), rounded up, and two at
// least where there are two.
//
// Half, because napd shares its host with the engines it serves and their
// clients, and it needs little CPU at once: every Go scheduler thread
// past the work at hand spins looking for more before it sleeps, on a
// CPU an engine or a client wanted. Two at least, because with one a
// request's forwarding waits for every other request's work: on the
// 2-CPU bench machine two threads gave 5-10 % more throughput at 32
// connections than one in each of twelve interleaved rounds (the engine
// gets its requests sooner and spends less CPU on each), with the same
// latency at one connection (docs/bench.md). Sidecar proxies size
// themselves alike (Istio's Envoy runs two worker threads unless given
// more).
func Procs(cpus int, envSet bool, avail int) int {
	switch {
	case cpus > 0:
		return cpus
	case envSet:
		return avail
	}
	return max(1, min(avail, max(2, (avail+1)/2)))
}

// defaultProcs is the runtime's own GOMAXPROCS, read before napd sets it.
var defaultProcs = runtime.GOMAXPROCS(0)

// setProcs applies cfg's agent.cpus, at start and on reload, and returns
// the GOMAXPROCS napd runs with and the one it ran with before.
func (a *Agent) setProcs(cfg *config.Config) (now, before int) {
	if !a.opts.TuneRuntime {
		n := runtime.GOMAXPROCS(0)
		return n, n
	}
	n := Procs(cfg.Agent.CPUs, os.Getenv("GOMAXPROCS") != "", defaultProcs)
	return n, runtime.GOMAXPROCS(n)
}

// setHeapFloor applies cfg's agent.heap_floor, at start and on reload (nil:
// napd stops, its GOGC is put back). Reloads run one at a time.
func (a *Agent) setHeapFloor(cfg *config.Config) {
	if !a.opts.TuneRuntime {
		return
	}
	if a.heapFloor != nil {
		a.heapFloor.Stop()
		a.heapFloor = nil
	}
	if cfg != nil && cfg.Agent.HeapFloor > 0 {
		a.heapFloor = heapfloor.Start(heapfloor.Base(os.Getenv("GOGC")), uint64(cfg.Agent.HeapFloor))
	}
}
