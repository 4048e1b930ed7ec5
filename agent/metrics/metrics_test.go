package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func scrape(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, rec.Body.String())
	}
	return fams
}

func value(f *dto.MetricFamily, labels map[string]string) (float64, bool) {
	for _, m := range f.GetMetric() {
		match := true
		for _, l := range m.GetLabel() {
			if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetrics_ScrapeParses(t *testing.T) {
	snap := Snapshot{
		Models: []Model{
			{Name: "a", State: lifecycle.Awake, QueueDepth: 3, Leases: 5, EngineBytes: 1 << 30, GPUBytes: map[string]int64{"0": 2 << 30}},
			{Name: "b", State: lifecycle.Sleeping, EngineBytes: -1, WeightsBytes: 16 << 30, WeightsResident: 12 << 30},
		},
		GPUs:          []GPU{{Index: "0", Vendor: "nvidia", Total: 80 << 30, Used: 10 << 30}, {Index: "1", Vendor: "amd", Total: 192 << 30, Used: 1 << 30}},
		HostAvailable: 4 << 30,
		HavePSI:       true, PSISomeAvg10: 1.5,
	}
	m := New(func() Snapshot { return snap })
	m.SetClients([]string{"alice", "bob"}) // the keys file at start
	ok := gateway.Observation{Model: "a", Client: "alice", Kind: request.Chat, Stream: true, Status: 200,
		Admitted: true, Duration: 3 * time.Second, FirstByte: 400 * time.Millisecond, QueueWait: 20 * time.Millisecond,
		WakeWait: 2 * time.Second, Usage: gateway.Usage{PromptTokens: 10, CompletionTokens: 5}, HasUsage: true}
	m.Request(ok)
	ok.Client, ok.Usage.PromptTokens, ok.WakeWait, ok.FirstByte = "bob", 7, 0, 0
	m.Request(ok)
	m.Request(gateway.Observation{Model: "a", Client: "bob", Kind: request.Chat, Status: 504})
	m.Request(gateway.Observation{Status: 401})
	m.Wakes.WithLabelValues("a", "ok").Inc()
	m.WakeTime.WithLabelValues("a").Observe(0.4)
	m.Sleeps.WithLabelValues("b", "idle").Inc()
	m.Decisions.WithLabelValues("b", "sleep", "idle").Inc()

	f := scrape(t, m)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"napd_model_state", map[string]string{"model": "a", "state": "awake"}, 1},
		{"napd_model_state", map[string]string{"model": "a", "state": "sleeping"}, 0},
		{"napd_model_state", map[string]string{"model": "b", "state": "sleeping"}, 1},
		{"napd_queue_depth", map[string]string{"model": "a"}, 3},
		{"napd_leases_in_flight", map[string]string{"model": "a"}, 5},
		{"napd_engine_memory_bytes", map[string]string{"model": "a"}, 1 << 30},
		{"napd_model_gpu_memory_bytes", map[string]string{"model": "a", "gpu": "0"}, 2 << 30},
		{"napd_gpu_memory_total_bytes", map[string]string{"gpu": "0", "vendor": "nvidia"}, 80 << 30},
		{"napd_gpu_memory_used_bytes", map[string]string{"gpu": "1", "vendor": "amd"}, 1 << 30},
		{"napd_host_memory_available_bytes", nil, 4 << 30},
		{"napd_weights_bytes", map[string]string{"model": "b"}, 16 << 30},
		{"napd_weights_resident_bytes", map[string]string{"model": "b"}, 12 << 30},
		{"napd_memory_pressure_some_avg10", nil, 1.5},
		{"napd_requests_total", map[string]string{"model": "a", "client": "alice", "code": "200"}, 1},
		{"napd_requests_total", map[string]string{"model": "a", "client": "bob", "code": "200"}, 1},
		{"napd_requests_total", map[string]string{"model": "a", "code": "504"}, 1},
		{"napd_requests_total", map[string]string{"model": "", "client": "", "code": "401"}, 1},
		{"napd_request_duration_seconds", map[string]string{"model": "a", "kind": "chat", "stream": "true"}, 2},
		{"napd_request_queue_wait_seconds", map[string]string{"model": "a", "kind": "chat", "stream": "true"}, 2},
		{"napd_request_first_byte_seconds", map[string]string{"model": "a", "kind": "chat", "stream": "true"}, 1},
		{"napd_request_wake_wait_seconds", map[string]string{"model": "a", "kind": "chat", "stream": "true"}, 1},
		{"napd_prompt_tokens_total", map[string]string{"model": "a", "client": "alice"}, 10},
		{"napd_prompt_tokens_total", map[string]string{"model": "a", "client": "bob"}, 7},
		{"napd_completion_tokens_total", map[string]string{"model": "a", "client": "bob"}, 5},
		{"napd_wakes_total", map[string]string{"model": "a", "result": "ok"}, 1},
		{"napd_wake_duration_seconds", map[string]string{"model": "a"}, 1},
		{"napd_sleeps_total", map[string]string{"model": "b", "reason": "idle"}, 1},
		{"napd_planner_decisions_total", map[string]string{"model": "b"}, 1},
	}
	for _, c := range checks {
		fam, ok := f[c.name]
		if !ok {
			t.Errorf("%s missing", c.name)
			continue
		}
		got, ok := value(fam, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := value(f["napd_engine_memory_bytes"], map[string]string{"model": "b"}); ok {
		t.Error("unmeasured engine memory must not be exported as a number")
	}
	if _, ok := value(f["napd_weights_resident_bytes"], map[string]string{"model": "a"}); ok {
		t.Error("a model without weight files has a weights series")
	}

	h := f["napd_request_duration_seconds"].GetMetric()[0].GetHistogram()
	if b := h.GetBucket(); len(b) != len(RequestBuckets)+1 || b[0].GetUpperBound() != 0.01 || b[len(b)-2].GetUpperBound() != 600 {
		t.Errorf("duration buckets %v, want 10ms … 10min and +Inf", b)
	}
	if h.GetSampleSum() != 6 {
		t.Errorf("duration sum %v, want 6", h.GetSampleSum())
	}

	m.SetClients([]string{"alice"})
	if _, ok := value(scrape(t, m)["napd_prompt_tokens_total"], map[string]string{"client": "bob"}); ok {
		t.Error("SetClients left the removed key's token counters")
	}
	// A request of the removed key that ends after the reload is counted
	// without its name: the dropped series do not come back.
	m.Request(gateway.Observation{Model: "a", Client: "bob", Status: 200, Admitted: true,
		HasUsage: true, Usage: gateway.Usage{PromptTokens: 1, CompletionTokens: 1}})
	f = scrape(t, m)
	if _, ok := value(f["napd_requests_total"], map[string]string{"client": "bob"}); ok {
		t.Error("a removed key's late request brought its series back")
	}
	if got, _ := value(f["napd_prompt_tokens_total"], map[string]string{"model": "a", "client": ""}); got != 1 {
		t.Errorf("the late request's tokens counted without a client name: %v, want 1", got)
	}
	m.Forget("a")
	f = scrape(t, m)
	for _, name := range []string{"napd_request_duration_seconds", "napd_prompt_tokens_total", "napd_wake_duration_seconds"} {
		if _, ok := f[name]; ok {
			t.Errorf("Forget left the removed model's %s", name)
		}
	}
	if _, ok := value(f["napd_requests_total"], map[string]string{"model": "a"}); ok {
		t.Error("Forget left the removed model's request counters")
	}
	// The model back (a later reload): its requests are counted again, in
	// new series, not in the handles of the dropped ones.
	m.Request(gateway.Observation{Model: "a", Client: "alice", Status: 200, Admitted: true, Duration: time.Second,
		HasUsage: true, Usage: gateway.Usage{PromptTokens: 2, CompletionTokens: 1}})
	f = scrape(t, m)
	for name, want := range map[string]float64{"napd_requests_total": 1, "napd_request_duration_seconds": 1, "napd_prompt_tokens_total": 2} {
		if got, _ := value(f[name], map[string]string{"model": "a", "client": "alice"}); got != want {
			t.Errorf("%s of the model back after Forget: %v, want %v", name, got, want)
		}
	}
}

// BenchmarkRequest: the metrics of one admitted request with usage.
func BenchmarkRequest(b *testing.B) {
	m := New(func() Snapshot { return Snapshot{} })
	o := gateway.Observation{Model: "qwen3-8b", Client: "alice", Kind: request.Chat, Stream: true, Status: 200,
		Duration: 2 * time.Second, Admitted: true, FirstByte: 300 * time.Millisecond, QueueWait: time.Millisecond,
		Usage: gateway.Usage{PromptTokens: 21, CompletionTokens: 24}, HasUsage: true}
	b.ReportAllocs()
	for b.Loop() {
		m.Request(o)
	}
}

// The usage ledger's totals are counters by key and model; a key the
// keys file no longer has has none.
func TestMetrics_UsageByKey(t *testing.T) {
	m := New(func() Snapshot {
		return Snapshot{HostAvailable: -1, Usage: []KeyUsage{
			{Key: "alice", Model: "a", ByteSeconds: 3 << 30, Wakes: 2, Swaps: 1},
			{Key: "gone", Model: "a", ByteSeconds: 1, Wakes: 1},
		}}
	})
	m.SetClients([]string{"alice"})
	fams := scrape(t, m)
	for name, want := range map[string]float64{"napd_gpu_byte_seconds_total": 3 << 30, "napd_wakes_caused_total": 2, "napd_swaps_caused_total": 1} {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("%s: %v, want one series (alice's)", name, f)
		}
		if v, ok := value(f, map[string]string{"key": "alice", "model": "a"}); !ok || v != want || f.GetType().String() != "COUNTER" {
			t.Errorf("%s{key=alice} = %v (%s), want counter %v", name, v, f.GetType(), want)
		}
	}
}
