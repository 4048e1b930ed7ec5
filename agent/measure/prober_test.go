package measure

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/gpu"
	"github.com/napd/napd/probes/host"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

type fixedHost struct{ s host.Snapshot }

func (h fixedHost) Snapshot(context.Context) (host.Snapshot, error) { return h.s, nil }

type fixedGPU struct{ s gpu.Snapshot }

func (g fixedGPU) Snapshot(context.Context) (gpu.Snapshot, error) { return g.s, nil }

// fakeSupervisor answers each model's processes.
type fakeSupervisor map[string][]int

func (f fakeSupervisor) Status(_ context.Context, spec supervisor.Spec) (supervisor.Status, error) {
	return supervisor.Status{PIDs: f[spec.Model], MemoryBytes: 1 << 30, HaveMemory: true}, nil
}

func (f fakeSupervisor) Probe(context.Context, supervisor.Spec) error { return nil }

// SleepsByItself: every engine of sleep = "llamacpp" sleeps by itself now.
func (f fakeSupervisor) SleepsByItself(_ context.Context, spec supervisor.Spec) (bool, error) {
	return spec.Sleep == sleepmode.LlamaCpp, nil
}

// engine is a vLLM-like /metrics that counts its scrapes.
func engine(t *testing.T, running int) (port int, scrapes *atomic.Int32) {
	scrapes = new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scrapes.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(enginemetrics.VLLMRunning + " " + strconv.Itoa(running) + "\n" + enginemetrics.VLLMWaiting + " 0\n"))
	}))
	t.Cleanup(srv.Close)
	_, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ = strconv.Atoi(p)
	return port, scrapes
}

func snap(name string, state lifecycle.State, port int, transport config.Transport) model.Snapshot {
	return model.Snapshot{
		Config:    &config.Model{Name: name, Transport: transport, Evidence: config.EvidenceAuto},
		Spec:      supervisor.Spec{Model: name, Port: port},
		Lifecycle: lifecycle.Snapshot{State: state},
	}
}

// One round: the host and the GPUs as their probes read them; per model its
// processes and memory, its GPU memory by its processes, and what its
// evidence says. Only serving engines are scraped (asking a sleeping vLLM
// anything but its control endpoints is not safe); a ZMQ worker's leases
// are its whole work.
func TestProber_Measure(t *testing.T) {
	busyPort, busyScrapes := engine(t, 2)
	asleepPort, asleepScrapes := engine(t, 0)
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	p := &Prober{
		Host: fixedHost{host.Snapshot{MemTotal: 64 << 30, MemAvailable: 32 << 30}},
		GPU: fixedGPU{gpu.Snapshot{Source: gpu.SourceSMI,
			Devices:   []gpu.Device{{Index: 0, Total: 24 << 30, Used: 6 << 30, Free: 18 << 30, HaveMemory: true}},
			Processes: []gpu.Process{{PID: 11, GPUIndex: 0, Used: 4 << 30, HaveUsed: true}, {PID: 99, GPUIndex: 0, Used: 2 << 30, HaveUsed: true}}}},
		Scraper:    &enginemetrics.Scraper{Client: &http.Client{Timeout: time.Second}},
		Supervisor: fakeSupervisor{"busy": {11}, "asleep": {12}},
		Clock:      func() time.Time { return at },
		Log:        slog.New(slog.DiscardHandler),
	}
	ms := p.Measure(context.Background(), []model.Snapshot{
		snap("busy", lifecycle.Awake, busyPort, config.TransportHTTP),
		snap("asleep", lifecycle.Sleeping, asleepPort, config.TransportHTTP),
		snap("worker", lifecycle.Awake, 0, config.TransportZMQ),
	})
	if !ms.At.Equal(at) || !ms.HaveMem || ms.Host.MemAvailable != 32<<30 || ms.GPUFrom != GPULive || len(ms.GPUs.Devices) != 1 {
		t.Fatalf("round: at %v, host %v %+v, gpus %v %+v", ms.At, ms.HaveMem, ms.Host, ms.GPUFrom, ms.GPUs)
	}
	if len(ms.Totals) != 1 || ms.Totals[0] != (planner.GPU{Index: 0, Total: 24 << 30, Free: 24 << 30}) {
		t.Errorf("totals %+v", ms.Totals)
	}
	busy := ms.Models["busy"]
	if busy.Activity != planner.EngineBusy || busy.Engine.Running != 2 || busy.GPUBytes[0] != 4<<30 || !busy.Proc.HaveMemory {
		t.Errorf("busy: %+v", busy)
	}
	if busyScrapes.Load() == 0 {
		t.Error("the awake engine was not scraped")
	}
	if asleepScrapes.Load() != 0 {
		t.Errorf("the sleeping engine was asked %d times", asleepScrapes.Load())
	}
	if a := ms.Models["asleep"]; a.Activity != planner.EngineNone || a.Engine.Engine != "" || len(a.GPUBytes) != 0 {
		t.Errorf("asleep: %+v", a)
	}
	if w := ms.Models["worker"]; w.Engine.Engine != enginemetrics.EngineWorker || !w.Engine.Have() || w.Activity != planner.EngineIdle {
		t.Errorf("worker: %+v", w)
	}
}

// The probe of an engine that sleeps by itself says whether it does, and
// reads its counters only where that is no work to it: never llama.cpp's
// /slots, which would wake it (or hold its sleep off).
func TestProbeEngine_SleepsByItself(t *testing.T) {
	var slots atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slots":
			slots.Add(1)
			w.Write([]byte(`[{"id":0,"is_processing":false}]`))
		default:
			w.WriteHeader(http.StatusNotImplemented) // no --metrics
		}
	}))
	defer srv.Close()
	port, _ := strconv.Atoi(srv.URL[strings.LastIndex(srv.URL, ":")+1:])
	p := &Prober{Scraper: &enginemetrics.Scraper{}, Supervisor: fakeSupervisor{}, Clock: time.Now, Log: slog.New(slog.DiscardHandler)}
	for _, sleep := range []string{sleepmode.LlamaCpp, sleepmode.Stop} {
		spec := supervisor.Spec{Model: "m", Port: port, Sleep: sleep}
		r := p.ProbeEngine(context.Background(), spec, &config.Model{Name: "m", Sleep: sleep})
		if r.Err != nil || r.Asleep != (sleep == sleepmode.LlamaCpp) {
			t.Errorf("sleep %s: probe %+v", sleep, r)
		}
	}
	if n := slots.Load(); n != 1 {
		t.Errorf("/slots asked %d times; want once, by the stop model's probe only", n)
	}
}
