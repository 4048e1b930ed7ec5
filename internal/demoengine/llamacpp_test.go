package demoengine

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/napd/napd/internal/httpfixture"
)

const recordings = "../../testdata/llamacpp/"

// shapeDiff reports where got is not shaped like the recorded want: a
// field the real engine does not send, or a value of another JSON kind.
// Arrays compare element by element, extra elements against the last
// recorded one.
func shapeDiff(want, got any, at string) []string {
	kind := func(v any) string { return fmt.Sprintf("%T", v) }
	if kind(want) != kind(got) {
		return []string{fmt.Sprintf("%s: %s, recorded %s", at, kind(got), kind(want))}
	}
	var out []string
	switch g := got.(type) {
	case map[string]any:
		w := want.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(g)) {
			if _, ok := w[k]; !ok {
				out = append(out, fmt.Sprintf("%s.%s: not sent by llama.cpp", at, k))
				continue
			}
			out = append(out, shapeDiff(w[k], g[k], at+"."+k)...)
		}
	case []any:
		w := want.([]any)
		for i, v := range g {
			if len(w) == 0 {
				return append(out, at+": recorded empty")
			}
			out = append(out, shapeDiff(w[min(i, len(w)-1)], v, fmt.Sprintf("%s[%d]", at, i))...)
		}
	}
	return out
}

// The llama.cpp flavor answers as the real llama-server did (recorded in
// testdata/llamacpp): the same statuses, no field llama.cpp does not send,
// the fields napd reads, and the same metric families.
func TestLlamaCpp_ShapesAsRecorded(t *testing.T) {
	idle := newEngine(Options{Flavor: FlavorLlamaCpp, Metrics: true, MaxNumSeqs: 2})
	loading := newEngine(Options{Flavor: FlavorLlamaCpp, StartupDelay: time.Hour})
	tests := []struct {
		file   string
		e      *Engine
		path   string
		exact  bool     // the same JSON document
		both   bool     // shaped alike both ways: no field missing either
		fields []string // top-level fields napd reads, that must be there
	}{
		{"health-ready.http", idle, "/health", true, false, nil},
		{"health-loading.http", loading, "/health", true, false, nil},
		{"health-loading.http", loading, "/v1/models", true, false, nil},
		{"props.http", idle, "/props", false, false, []string{"is_sleeping", "model_path", "total_slots"}},
		{"slots-idle.http", idle, "/slots", false, true, nil},
	}
	for _, tt := range tests {
		rec := httpfixture.Load(t, recordings+tt.file)
		got := do(tt.e.Handler(), "GET", tt.path, "")
		if got.Code != rec.Status {
			t.Errorf("%s: status %d, recorded %d", tt.path, got.Code, rec.Status)
			continue
		}
		w, g := httpfixture.JSON(t, rec.Body), httpfixture.JSON(t, got.Body.Bytes())
		switch {
		case tt.exact && !reflect.DeepEqual(w, g):
			t.Errorf("%s = %s, recorded %s", tt.path, got.Body, rec.Body)
		case !tt.exact:
			diffs := shapeDiff(w, g, tt.path)
			if tt.both {
				diffs = append(diffs, shapeDiff(g, w, "recorded "+tt.path)...)
			}
			for _, d := range diffs {
				t.Error(d)
			}
			for _, f := range tt.fields {
				if _, ok := g.(map[string]any)[f]; !ok {
					t.Errorf("%s lacks %q", tt.path, f)
				}
			}
		}
	}

	families := func(text string) map[string]string {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for name, f := range fams {
			out[name] = f.GetType().String()
		}
		return out
	}
	got := do(idle.Handler(), "GET", "/metrics", "")
	if want := families(string(httpfixture.Load(t, recordings+"metrics-idle.http").Body)); !reflect.DeepEqual(families(got.Body.String()), want) {
		t.Errorf("metric families %v, recorded %v", families(got.Body.String()), want)
	}
}

// A busy slot is shaped as a real one generating.
func TestLlamaCpp_BusySlotAsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{Flavor: FlavorLlamaCpp, MaxNumSeqs: 2, TTFT: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := async(ctx, e.Handler(), "POST", "/v1/completions", `{"model":"demo","prompt":"x"}`)
		synctest.Wait()
		busy := func(slots any) any {
			for _, s := range slots.([]any) {
				if s.(map[string]any)["is_processing"] == true {
					return s
				}
			}
			t.Fatalf("no busy slot in %v", slots)
			return nil
		}
		rec := busy(httpfixture.JSON(t, httpfixture.Load(t, recordings+"slots-busy.http").Body))
		got := busy(httpfixture.JSON(t, do(e.Handler(), "GET", "/slots", "").Body.Bytes()))
		for _, d := range shapeDiff(rec, got, "busy slot") {
			t.Error(d)
		}
		if next := got.(map[string]any)["next_token"].([]any); len(next) != 1 || next[0].(map[string]any)["n_decoded"] == nil {
			t.Errorf("busy slot %v: want next_token with n_decoded", got)
		}
		cancel()
		<-done
	})
}

// --sleep-idle-seconds: the engine sleeps by itself after SleepIdle without
// a task (its weights freed, /props is_sleeping); /health, /props and
// /metrics neither wake it nor hold its sleep off; a task (here /tokenize,
// as napd's wake sends) reloads it, taking WakeDelay, and is answered then;
// /slots is a task too.
func TestLlamaCpp_SleepIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{Flavor: FlavorLlamaCpp, Metrics: true, SleepIdle: 10 * time.Second, WakeDelay: 2 * time.Second, MemoryBytes: 1 << 20})
		h := e.Handler()
		sleeping := func() bool {
			return decode[struct {
				IsSleeping bool `json:"is_sleeping"`
			}](t, do(h, "GET", "/props", "")).IsSleeping
		}
		for range 9 {
			time.Sleep(time.Second)
			do(h, "GET", "/health", "")
			do(h, "GET", "/metrics", "")
		}
		synctest.Wait()
		if sleeping() {
			t.Fatal("asleep after 9 s of a 10 s idle sleep")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !sleeping() || e.Stats().WeightsBytes != 0 || e.Stats().SelfSleeps != 1 {
			t.Fatalf("after 10 s idle: sleeping %v, %+v; want asleep with the weights freed", sleeping(), e.Stats())
		}

		start := time.Now()
		rec := do(h, "POST", "/tokenize", `{"content":""}`)
		if rec.Code != 200 || time.Since(start) != 2*time.Second || sleeping() || e.Stats().WeightsBytes != 1<<20 {
			t.Fatalf("tokenize: %d %s after %s, sleeping %v, %+v; want it answered once reloaded (2 s)", rec.Code, rec.Body, time.Since(start), sleeping(), e.Stats())
		}
		// A completion now holds the next sleep off for its own time.
		wantCode(t, do(h, "POST", "/v1/completions", `{"model":"demo","prompt":"x","max_tokens":1}`), 200)
		time.Sleep(9 * time.Second)
		wantCode(t, do(h, "GET", "/slots", ""), 200) // a task: the idle clock starts again
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if sleeping() {
			t.Fatal("asleep 9 s after /slots")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !sleeping() || e.Stats().SelfSleeps != 2 || e.Stats().Reloads != 1 {
			t.Fatalf("sleeping %v, %+v; want the second idle sleep", sleeping(), e.Stats())
		}
	})
}
