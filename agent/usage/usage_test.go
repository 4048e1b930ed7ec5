package usage

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// at is t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// tally is a sink that sums the charges per key.
type tally map[string][2]float64

func (t tally) charge(_, key string, b, g float64) {
	v := t[key]
	t[key] = [2]float64{v[0] + b, v[1] + g}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// The integral against hand-computed cases: the footprint times the
// key's share of the requests in flight, integrated over time.
func TestMeter_HandComputed(t *testing.T) {
	type ev struct {
		at     float64
		op     string // "begin", "end", "resize"
		key    string
		bytes  int64
		gpus   float64
		verify map[string]float64 // byte-seconds charged so far, per key
	}
	for _, tc := range []struct {
		name string
		evs  []ev
		want map[string][2]float64 // byte-seconds, GPU-seconds
	}{
		{"one key alone, 10 s at 16 GiB (half a 32 GiB GPU)", []ev{
			{at: 0, op: "resize", bytes: 16 << 30, gpus: 0.5},
			{at: 0, op: "begin", key: "a"},
			{at: 10, op: "end", key: "a"},
		}, map[string][2]float64{"a": {10 * 16 << 30, 5}}},
		{"overlapping keys share: A 0–10 s, B 5–15 s, 10 bytes", []ev{
			{at: 0, op: "resize", bytes: 10, gpus: 1},
			{at: 0, op: "begin", key: "A"},
			{at: 5, op: "begin", key: "B", verify: map[string]float64{"A": 50}},
			{at: 10, op: "end", key: "A", verify: map[string]float64{"A": 75, "B": 25}},
			{at: 15, op: "end", key: "B"},
		}, map[string][2]float64{"A": {75, 7.5}, "B": {75, 7.5}}},
		{"two requests of A and one of B: A two thirds", []ev{
			{at: 0, op: "resize", bytes: 30, gpus: 3},
			{at: 0, op: "begin", key: "A"}, {at: 0, op: "begin", key: "A"}, {at: 0, op: "begin", key: "B"},
			{at: 1, op: "end", key: "A"}, {at: 1, op: "end", key: "A"}, {at: 1, op: "end", key: "B"},
		}, map[string][2]float64{"A": {20, 2}, "B": {10, 1}}},
		{"the footprint measured larger mid-request counts from then", []ev{
			{at: 0, op: "resize", bytes: 10},
			{at: 0, op: "begin", key: "a"},
			{at: 4, op: "resize", bytes: 20},
			{at: 6, op: "end", key: "a"},
		}, map[string][2]float64{"a": {4*10 + 2*20, 0}}},
		{"memory held with nothing in flight charges nobody", []ev{
			{at: 0, op: "resize", bytes: 10},
			{at: 0, op: "begin", key: "a"}, {at: 1, op: "end", key: "a"},
			{at: 100, op: "begin", key: "a"}, {at: 101, op: "end", key: "a"},
		}, map[string][2]float64{"a": {20, 0}}},
		{"an end without its begin changes nothing; time never runs back", []ev{
			{at: 0, op: "resize", bytes: 10},
			{at: 1, op: "end", key: "ghost"},
			{at: 2, op: "begin", key: "a"},
			{at: 1, op: "end", key: "a"}, // a clock step back: charged nothing, ends it
			{at: 5, op: "begin", key: "b"},
			{at: 6, op: "end", key: "b"},
		}, map[string][2]float64{"b": {10, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m meter
			got := tally{}
			for _, e := range tc.evs {
				switch e.op {
				case "begin":
					m.begin(at(e.at), "m", e.key, got)
				case "end":
					m.end(at(e.at), "m", e.key, got)
				case "resize":
					m.resize(at(e.at), "m", e.bytes, e.gpus, got)
				}
				for k, b := range e.verify {
					if !near(got[k][0], b) {
						t.Errorf("at %vs: %s charged %v byte-seconds, want %v", e.at, k, got[k][0], b)
					}
				}
			}
			for k, w := range tc.want {
				if !near(got[k][0], w[0]) || !near(got[k][1], w[1]) {
					t.Errorf("%s charged %v byte-s, %v GPU-s; want %v, %v", k, got[k][0], got[k][1], w[0], w[1])
				}
			}
			for k := range got {
				if _, ok := tc.want[k]; !ok && (got[k][0] != 0 || got[k][1] != 0) {
					t.Errorf("%s charged %v, want nothing", k, got[k])
				}
			}
		})
	}
}

func TestGPUShare(t *testing.T) {
	totals := map[int]int64{0: 80 << 30, 1: 80 << 30, 2: 40 << 30}
	for _, tc := range []struct {
		bytes int64
		gpus  []int
		want  float64
	}{
		{40 << 30, []int{0}, 0.5},
		{80 << 30, []int{0, 1}, 1},   // 40 GiB on each of two 80 GiB GPUs
		{80 << 30, []int{1, 2}, 1.5}, // 40 of 80, and 40 of 40
		{100 << 30, []int{2}, 1},     // more than the GPU: at most whole
		{10, []int{7}, 1},            // a GPU of unknown size counts whole
		{0, []int{0}, 0},
		{10, nil, 0},
	} {
		if got := GPUShare(tc.bytes, tc.gpus, totals); !near(got, tc.want) {
			t.Errorf("GPUShare(%d, %v) = %v, want %v", tc.bytes, tc.gpus, got, tc.want)
		}
	}
}

// The ledger keeps each key's use per model in total and by hour, and a
// day's use per key for quotas, counted from the host's midnight; a
// request in flight is charged up to the moment it is asked about.
func TestLedger_HoursDaysAndQuotaWindow(t *testing.T) {
	loc := time.FixedZone("UTC+2", 2*3600)
	l := New("", loc)
	start := time.Date(2026, 12, 2, 21, 30, 0, 0, time.UTC) // 23:30 in loc
	l.Resize(start, "a", 36<<30, 0.5)
	l.Woke(start, "a", "alice")
	l.Swapped(start, "a", "alice")
	l.Begin(start, "a", "alice")
	gpuHours, _, end := l.Today("alice", start.Add(20*time.Minute))
	if !near(gpuHours, 0.5*20/60) { // half a GPU for 20 minutes
		t.Errorf("in flight for 20 min: %v GPU hours today, want 1/6", gpuHours)
	}
	if want := time.Date(2026, 12, 3, 0, 0, 0, 0, loc); !end.Equal(want) {
		t.Errorf("the day ends at %v, want %v", end, want)
	}
	// Charged on the ticker's round just before midnight in loc (22:00
	// UTC); what follows is the next day's, and the next hour's.
	l.Tick(start.Add(30*time.Minute - time.Second))
	l.End(start.Add(time.Hour), "a", "alice")
	l.Tokens(start.Add(time.Hour), "a", "alice", 100, 20)
	gpuHours, tokens, end := l.Today("alice", start.Add(time.Hour))
	if !near(gpuHours, 0.5*1801/3600) || tokens != 120 {
		t.Errorf("the next day: %v GPU hours, %d tokens; want the 30m01s since midnight and 120", gpuHours, tokens)
	}
	if want := time.Date(2026, 12, 4, 0, 0, 0, 0, loc); !end.Equal(want) {
		t.Errorf("the next day ends at %v, want %v", end, want)
	}
	total := l.Total()
	if len(total) != 1 || total[0].Key != "alice" || total[0].Wakes != 1 || total[0].Swaps != 1 ||
		!near(total[0].ByteSeconds, 3600*36<<30) || total[0].PromptTokens != 100 || total[0].CompletionTokens != 20 {
		t.Errorf("total %+v", total)
	}
	// By hour: since 22:10 UTC counts the hour of 22:00 only.
	if rows := l.Since(start.Add(40 * time.Minute)); len(rows) != 1 || !near(rows[0].ByteSeconds, 1801*36<<30) || rows[0].Wakes != 0 || rows[0].PromptTokens != 100 {
		t.Errorf("since 22:10: %+v", rows)
	}
	if rows := l.Since(start); len(rows) != 1 || rows[0].Wakes != 1 || !near(rows[0].GPUSeconds, 1800) {
		t.Errorf("since 21:30: %+v", rows)
	}
	// Hours older than KeepHours go.
	l.Tick(start.Add(KeepHours * time.Hour))
	if rows := l.Since(start.Add(-time.Hour)); len(rows) != 1 || rows[0].Wakes != 0 {
		t.Errorf("after KeepHours the oldest hour stays: %+v", rows)
	}
	l.Tick(start.Add((KeepHours + 1) * time.Hour))
	if rows := l.Since(start.Add(-time.Hour)); len(rows) != 0 {
		t.Errorf("after KeepHours + 1: %+v", rows)
	}
	if len(l.Total()) != 1 {
		t.Error("the totals went with the hours")
	}
}

// What the ledger counted survives a restart (usage.json), and a file
// that is not a ledger is moved aside, not lost, and not fatal.
func TestLedger_SurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "usage.json")
	l, err := Open(path, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	l.Resize(t0, "a", 100, 1)
	l.Begin(t0, "a", "alice")
	l.Tick(at(10))
	l.Tokens(at(10), "a", "alice", 5, 5)
	if err := l.Save(); err != nil {
		t.Fatal(err)
	}
	again, err := Open(path, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := again.Total(), l.Total(); len(got) != 1 || got[0] != want[0] {
		t.Errorf("after a restart: %+v, want %+v", got, want)
	}
	if h, tok, _ := again.Today("alice", at(20)); !near(h, 10.0/3600) || tok != 10 {
		t.Errorf("today after a restart: %v GPU hours, %d tokens", h, tok)
	}
	if rows := again.Since(t0); len(rows) != 1 || !near(rows[0].ByteSeconds, 1000) {
		t.Errorf("hours after a restart: %+v", rows)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	broken, err := Open(path, time.UTC)
	if err == nil || !strings.Contains(err.Error(), "moved to "+path+".corrupt") || broken == nil || len(broken.Total()) != 0 {
		t.Errorf("a corrupt file: %v", err)
	}
	if _, err := os.Stat(path + ".corrupt"); err != nil {
		t.Errorf("the corrupt file was not kept: %v", err)
	}
}

// The bounds: beyond maxPairs keys and models, use is accounted to
// OtherKeys; beyond maxHourRows the oldest hours go first.
func TestLedger_Bounds(t *testing.T) {
	l := New("", time.UTC)
	for i := range maxPairs + 5 {
		l.Tokens(t0, "m", "k"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String(), 1, 0)
	}
	total := l.Total()
	if len(total) != maxPairs+1 {
		t.Fatalf("%d pairs, want %d and %s", len(total), maxPairs, OtherKeys)
	}
	for _, r := range total {
		if r.Key == OtherKeys && r.PromptTokens != 5 {
			t.Errorf("%s has %d tokens, want the 5 beyond the bound", OtherKeys, r.PromptTokens)
		}
	}
	l = New("", time.UTC)
	for h := range 6 {
		for k := range maxHourRows / 5 {
			l.Tokens(t0.Add(time.Duration(h)*time.Hour), "m", time.Duration(k).String(), 1, 0)
		}
	}
	l.Tick(t0.Add(5 * time.Hour))
	if rows := l.Since(t0); len(rows) != maxHourRows/5 || rows[0].PromptTokens != 5 {
		t.Errorf("after the bound: %d rows, the first with %d tokens: want the newest five hours", len(rows), rows[0].PromptTokens)
	}
}

// FuzzLoad: whatever usage.json holds, it is read into a ledger with no
// negative figure, or refused; what is read is saved and read back alike.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"version":1,"total":[{"key":"a","model":"m","byte_seconds":1,"wakes":2}],"hours":[{"hour":3600,"key":"a","model":"m","gpu_seconds":1}],"date":"2026-12-02","today":[{"key":"a","tokens":3}]}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"hours":[{"hour":5}]}`))
	f.Add([]byte(`{"version":1,"total":[{"wakes":-1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l := New(filepath.Join(t.TempDir(), "usage.json"), time.UTC)
		if l.load(data) != nil {
			return
		}
		for _, r := range l.Total() {
			if !r.valid() {
				t.Fatalf("read a negative figure: %+v", r)
			}
		}
		l.dirty = true
		if err := l.Save(); err != nil {
			t.Fatal(err)
		}
		again, err := Open(l.path, time.UTC)
		if err != nil {
			t.Fatalf("saved, then: %v", err)
		}
		if a, b := again.Total(), l.Total(); len(a) != len(b) {
			t.Fatalf("read back %d rows, saved %d", len(a), len(b))
		}
	})
}

// A request's start and end on the ledger allocate nothing once its key
// and model are known: they are on every request's path.
func TestLedger_BeginEndAllocs(t *testing.T) {
	l := New("", time.UTC)
	l.Resize(t0, "m", 1<<30, 0.5)
	now := t0
	round := func() {
		now = now.Add(time.Millisecond)
		l.Begin(now, "m", "alice")
		l.End(now.Add(time.Microsecond), "m", "alice")
	}
	round()
	if n := testing.AllocsPerRun(100, round); n > 0 {
		t.Errorf("%.1f allocations per request, want 0", n)
	}
}
