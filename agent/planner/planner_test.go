package planner

import (
	"bytes"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/sleepmode"
)

const GiB = 1 << 30

var now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

type opt func(*Model)

// model is an awake, proven-idle model on GPU 0, idle for 5 minutes, with
// a 15m idle timeout and a 1m anti-flap minimum.
func model(name string, opts ...opt) Model {
	m := Model{
		Name: name, State: lifecycle.Awake, Sleep: sleepmode.Stop, GPUs: []int{0},
		IdleTimeout: 15 * time.Minute, IdleMinimum: time.Minute, Engine: EngineIdle,
	}
	idleFor(5 * time.Minute)(&m)
	for _, o := range opts {
		o(&m)
	}
	return m
}

func idleFor(d time.Duration) opt {
	return func(m *Model) { m.Leases.IdleSince, m.LastUsed = now.Add(-d), now.Add(-d) }
}
func holds(gpuBytes map[int]int64) opt {
	return func(m *Model) {
		m.GPUBytes = gpuBytes
		m.GPUs = m.GPUs[:0]
		for g := range gpuBytes {
			m.GPUs = append(m.GPUs, g)
		}
	}
}
func onGPUs(gs ...int) opt            { return func(m *Model) { m.GPUs = gs } }
func footprint(b int64) opt           { return func(m *Model) { m.Footprint = b } }
func sleep(s string) opt              { return func(m *Model) { m.Sleep = s } }
func state(s lifecycle.State) opt     { return func(m *Model) { m.State = s } }
func hostBytes(b int64) opt           { return func(m *Model) { m.HostBytes = b } }
func engine(e Engine) opt             { return func(m *Model) { m.Engine = e } }
func leases(n int) opt                { return func(m *Model) { m.Leases.Active = n } }
func idleTimeout(d time.Duration) opt { return func(m *Model) { m.IdleTimeout = d } }
func pinned(m *Model)                 { m.Pinned = true }
func untrackedAllowed(m *Model)       { m.AllowUntracked = true }

var pressure = config.Pressure{GPUReserve: 1 * GiB, HostReserve: 2 * GiB, PSISomeAvg10: 20}

// roomy is a host and GPU without any pressure.
func roomy(models ...Model) Input {
	return Input{
		Now: now, Models: models, Pressure: pressure,
		GPUs: []GPU{{Index: 0, Total: 80 * GiB, Free: 40 * GiB}, {Index: 1, Total: 80 * GiB, Free: 40 * GiB}},
		Host: Host{MemAvailable: 100 * GiB, HaveMem: true, PSISomeAvg10: 0.5, HavePSI: true},
	}
}

func gpuFree(in Input, g int, free int64) Input {
	for i := range in.GPUs {
		if in.GPUs[i].Index == g {
			in.GPUs[i].Free = free
		}
	}
	return in
}

type want struct {
	model  string
	action Action
	strat  string
	reason Reason
}

func summary(ds []Decision) []want {
	var out []want
	for _, d := range ds {
		out = append(out, want{d.Model, d.Action, d.Strategy, d.Reason})
	}
	return out
}

func TestPlan_Rules(t *testing.T) {
	tests := []struct {
		name       string
		in         Input
		want       []want
		unrelieved int
		unproven   []string
	}{
		{
			name: "idle past its timeout sleeps with its strategy",
			in:   roomy(model("a", sleep(sleepmode.VLLML2), idleFor(16*time.Minute)), model("b")),
			want: []want{{"a", ActionSleep, sleepmode.VLLML2, ReasonIdle}},
		},
		{
			name: "idle timeout 0 never sleeps for idleness",
			in:   roomy(model("a", idleTimeout(0), idleFor(48*time.Hour))),
		},
		{
			name: "never: a live lease, even long after IdleSince",
			in:   roomy(model("a", leases(1), idleFor(time.Hour))),
		},
		{
			name: "never: an engine reporting work nobody leased",
			in:   roomy(model("a", engine(EngineBusy), idleFor(time.Hour))),
		},
		{
			name:     "never: unprovable idleness without allow_untracked_unload",
			in:       roomy(model("a", engine(EngineNone), idleFor(time.Hour)), model("b", engine(EngineNone), idleFor(time.Second)), model("c", engine(EngineNone), pinned, idleFor(time.Hour))),
			unproven: []string{"a"},
		},
		{
			name: "unprovable idleness with allow_untracked_unload sleeps",
			in:   roomy(model("a", engine(EngineNone), untrackedAllowed, idleFor(time.Hour))),
			want: []want{{"a", ActionSleep, sleepmode.Stop, ReasonIdle}},
		},
		{
			name: "never: pinned or sleep none, even idle under GPU pressure",
			in: gpuFree(roomy(
				model("p", pinned, idleFor(time.Hour), holds(map[int]int64{0: 30 * GiB})),
				model("n", sleep(sleepmode.None), idleFor(time.Hour), holds(map[int]int64{0: 30 * GiB})),
			), 0, 0),
			unrelieved: 1,
		},
		{
			name: "never: a model that is not awake",
			in:   roomy(model("a", state(lifecycle.Waking), idleFor(time.Hour)), model("b", state(lifecycle.Sleeping), idleFor(time.Hour))),
		},
		{
			name: "GPU pressure sleeps the least recently used idle model that covers it",
			in: gpuFree(roomy(
				model("new", idleFor(2*time.Minute), holds(map[int]int64{0: 10 * GiB})),
				model("old", sleep(sleepmode.VLLML1), idleFor(10*time.Minute), holds(map[int]int64{0: 10 * GiB})),
				model("other-gpu", idleFor(14*time.Minute), holds(map[int]int64{1: 10 * GiB})),
			), 0, GiB/2),
			want: []want{{"old", ActionSleep, sleepmode.VLLML1, ReasonGPUPressure}},
		},
		{
			name: "GPU pressure takes as many as the shortfall needs, LRU first",
			in: gpuFree(roomy(
				model("a", idleFor(3*time.Minute), holds(map[int]int64{0: GiB / 2})),
				model("b", idleFor(4*time.Minute), holds(map[int]int64{0: GiB / 2})),
				model("c", idleFor(2*time.Minute), holds(map[int]int64{0: GiB / 2})),
			), 0, 0),
			want: []want{{"b", ActionSleep, sleepmode.Stop, ReasonGPUPressure}, {"a", ActionSleep, sleepmode.Stop, ReasonGPUPressure}},
		},
		{
			name: "GPU pressure uses the footprint share when not measured",
			in:   gpuFree(roomy(model("tp2", onGPUs(0, 1), footprint(8*GiB))), 1, 0),
			want: []want{{"tp2", ActionSleep, sleepmode.Stop, ReasonGPUPressure}},
		},
		{
			name: "idle decisions count toward GPU relief",
			in: gpuFree(roomy(
				model("expired", idleFor(20*time.Minute), holds(map[int]int64{0: 4 * GiB})),
				model("recent", idleFor(5*time.Minute), holds(map[int]int64{0: 4 * GiB})),
			), 0, 0),
			want: []want{{"expired", ActionSleep, sleepmode.Stop, ReasonIdle}},
		},
		{
			name: "a model still draining counts as relief: no flood of sleeps",
			in: gpuFree(roomy(
				model("going", state(lifecycle.Draining), holds(map[int]int64{0: 4 * GiB})),
				model("idle", holds(map[int]int64{0: 4 * GiB})),
			), 0, 0),
		},
		{
			name: "never flap: a model idle for less than its minimum is no victim",
			in: gpuFree(roomy(
				model("just-woken", idleFor(20*time.Second), holds(map[int]int64{0: 20 * GiB})),
			), 0, 0),
			unrelieved: 1,
		},
		{
			name: "host pressure stops a vllm-l1 model instead of sleeping it",
			in: func() Input {
				in := roomy(
					model("l1", sleep(sleepmode.VLLML1), hostBytes(6*GiB)),
					model("l2", sleep(sleepmode.VLLML2), hostBytes(6*GiB), idleFor(10*time.Minute)),
				)
				in.Host.MemAvailable = GiB
				return in
			}(),
			want: []want{{"l1", ActionStop, sleepmode.Stop, ReasonHostPressure}},
		},
		{
			name: "host pressure stops a vllm-l1 model asleep with weights in RAM",
			in: func() Input {
				in := roomy(model("parked", sleep(sleepmode.VLLML1), state(lifecycle.Sleeping), hostBytes(30*GiB), engine(EngineNone)))
				in.Host.MemAvailable = GiB
				return in
			}(),
			want: []want{{"parked", ActionStop, sleepmode.Stop, ReasonHostPressure}},
		},
		{
			name: "under host pressure an idle vllm-l1 sleep becomes a stop",
			in: func() Input {
				in := roomy(model("l1", sleep(sleepmode.VLLML1), idleFor(time.Hour), hostBytes(8*GiB)))
				in.Host.MemAvailable = GiB
				return in
			}(),
			want: []want{{"l1", ActionStop, sleepmode.Stop, ReasonIdle}},
		},
		{
			name: "llamacpp: never slept for idleness by napd (the engine sleeps by itself)",
			in:   roomy(model("l", sleep(sleepmode.LlamaCpp), idleFor(time.Hour))),
		},
		{
			name: "llamacpp: GPU pressure stops it",
			in:   gpuFree(roomy(model("l", sleep(sleepmode.LlamaCpp), idleFor(10*time.Minute), holds(map[int]int64{0: 20 * GiB}))), 0, 0),
			want: []want{{"l", ActionStop, sleepmode.Stop, ReasonGPUPressure}},
		},
		{
			name: "llamacpp: host pressure stops one asleep by itself (its process and host memory stay)",
			in: func() Input {
				in := roomy(model("l", sleep(sleepmode.LlamaCpp), state(lifecycle.Sleeping), hostBytes(3*GiB), idleFor(10*time.Minute),
					func(m *Model) { m.Slept, m.SleptAt = sleepmode.LlamaCpp, now.Add(-time.Minute) }))
				in.Host.MemAvailable = GiB
				return in
			}(),
			want: []want{{"l", ActionStop, sleepmode.Stop, ReasonHostPressure}},
		},
		{
			name: "host pressure with nothing to stop is reported",
			in: func() Input {
				in := roomy(model("busy", leases(2), hostBytes(8*GiB)))
				in.Host.MemAvailable = GiB
				return in
			}(),
			unrelieved: 1,
		},
		{
			name: "PSI pressure stops one engine per round, LRU first",
			in: func() Input {
				in := roomy(
					model("a", hostBytes(4*GiB), idleFor(3*time.Minute)),
					model("b", hostBytes(4*GiB), idleFor(4*time.Minute)),
				)
				in.Host.PSISomeAvg10 = 35
				return in
			}(),
			want: []want{{"b", ActionSleep, sleepmode.Stop, ReasonPSIPressure}},
		},
		{
			name: "no PSI reading is no PSI pressure",
			in: func() Input {
				in := roomy(model("a", hostBytes(4*GiB)))
				in.Host.PSISomeAvg10, in.Host.HavePSI = 99, false
				return in
			}(),
		},
		{
			name: "each model gets one decision",
			in: func() Input {
				in := gpuFree(roomy(model("a", idleFor(time.Hour), hostBytes(4*GiB), holds(map[int]int64{0: 4 * GiB}))), 0, 0)
				in.Host.MemAvailable = 0
				return in
			}(),
			want:       []want{{"a", ActionSleep, sleepmode.Stop, ReasonIdle}},
			unrelieved: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Plan(tt.in)
			if s := summary(got.Decisions); !reflect.DeepEqual(s, tt.want) {
				t.Errorf("decisions = %+v\nwant %+v", s, tt.want)
			}
			if !slices.Equal(got.Unproven, tt.unproven) {
				t.Errorf("unproven = %q, want %q", got.Unproven, tt.unproven)
			}
			if len(got.Unrelieved) != tt.unrelieved {
				t.Errorf("unrelieved = %q, want %d", got.Unrelieved, tt.unrelieved)
			}
			for _, d := range got.Decisions {
				if d.Message == "" || !strings.Contains(d.Message, d.Model) {
					t.Errorf("message %q does not name %s", d.Message, d.Model)
				}
			}
		})
	}
}

func TestPlan_MessagesCarryFigures(t *testing.T) {
	in := gpuFree(roomy(model("old", idleFor(10*time.Minute), holds(map[int]int64{0: 10 * GiB}))), 0, GiB/2)
	got := Plan(in).Decisions
	if len(got) != 1 {
		t.Fatalf("decisions = %+v", got)
	}
	d := got[0]
	wantMsg := "sleep old (stop): GPU 0 has 0.5 GiB free, below gpu_reserve 1.0 GiB; frees ~10.0 GiB there; idle 10m0s"
	if d.Message != wantMsg {
		t.Errorf("message = %q\nwant %q", d.Message, wantMsg)
	}
	if d.FreesGPU[0] != 10*GiB || d.IdleFor != 10*time.Minute {
		t.Errorf("figures: frees %v, idle %v", d.FreesGPU, d.IdleFor)
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("planner", "decision", d)
	for _, field := range []string{"decision.model=old", "decision.reason=gpu-pressure", "decision.frees_gpu0_bytes=10737418240", "decision.idle_for=10m0s"} {
		if !strings.Contains(buf.String(), field) {
			t.Errorf("log line %q lacks %s", buf.String(), field)
		}
	}
}

func TestPlan_DoesNotModifyInput(t *testing.T) {
	in := roomy(model("b", idleFor(time.Hour)), model("a", idleFor(2*time.Hour)))
	Plan(in)
	if in.Models[0].Name != "b" {
		t.Error("Plan reordered the caller's models")
	}
}

// Without a fresh GPU reading the fit is checked against learned
// footprints: a device's total less the share of every model on it that is
// not asleep, or the last reading when that is lower.
func TestInput_Estimate(t *testing.T) {
	in := Input{Now: now, Pressure: pressure,
		GPUs: []GPU{{Index: 0, Total: 24 * GiB, Free: 24 * GiB}, {Index: 1, Total: 24 * GiB, Free: 12 * GiB}},
		Models: []Model{
			model("a", footprint(10*GiB)),
			model("tp", footprint(8*GiB), onGPUs(0, 1)),
			model("asleep", footprint(20*GiB), state(lifecycle.Sleeping)),
			model("unknown"),
			model("big", footprint(16*GiB), state(lifecycle.Waking)),
		},
		GPUNote: "the GPU probe fails; estimated",
	}
	in.Estimate()
	want := []GPU{{Index: 0, Total: 24 * GiB, Free: 10 * GiB}, {Index: 1, Total: 24 * GiB, Free: 12 * GiB}}
	if !reflect.DeepEqual(in.GPUs, want) {
		t.Fatalf("Estimate: GPUs %+v, want %+v", in.GPUs, want)
	}
	if got := in.Models[0].GPUBytes; got[0] != 10*GiB {
		t.Errorf("a holds %v, want its footprint", got)
	}
	waiters := []Waiter{{Model: "big", Oldest: now}}
	p := PlanRoom(in, waiters)
	if len(p.Sleeps) != 1 || p.Sleeps[0].Model != "a" {
		t.Errorf("estimated: %+v", p.Sleeps)
	}
	in.Models[0].Pinned = true
	p = PlanRoom(in, waiters)
	want1 := "cannot fit big (16.0 GiB) on GPU 0 (24.0 GiB, gpu_reserve 1.0 GiB): held by pinned a (10.0 GiB), which waiting cannot free (the GPU probe fails; estimated)"
	if tu, _ := p.Turn("big"); tu.Verdict != RoomRefused || tu.Message != want1 {
		t.Errorf("refusal %v %q\nwant %q", tu.Verdict, tu.Message, want1)
	}
}

// A probe that fails with no reading to fall back on does not open the
// gate: a model whose footprint is known is refused, saying why.
func TestPlanRoom_GPUUnknownRefuses(t *testing.T) {
	in := Input{Now: now, GPUUnknown: true, GPUNote: "GPU probe failed: timeout; no reading yet",
		Models: []Model{model("big", footprint(16*GiB), state(lifecycle.Waking)), model("free", state(lifecycle.Waking))}}
	p := PlanRoom(in, []Waiter{{Model: "big", Oldest: now}, {Model: "free", Oldest: now}})
	if tu, _ := p.Turn("big"); tu.Verdict != RoomRefused || tu.Message != "cannot check that big (16.0 GiB) fits on GPU 0: GPU probe failed: timeout; no reading yet" {
		t.Errorf("%v %q", tu.Verdict, tu.Message)
	}
	if tu, _ := p.Turn("free"); tu.Verdict != RoomFits {
		t.Errorf("a model without a footprint is not checked: %v", tu.Verdict)
	}
}
