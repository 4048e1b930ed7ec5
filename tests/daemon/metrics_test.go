package daemon

import (
	"context"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/napd/napd/tests/harness"
)

// The Prometheus output on agent.metrics_listen, parsed with expfmt:
// state, wakes and their durations, requests by code, queue depth, leases,
// engine memory, and after an idle sleep the sleep and the planner decision
// that caused it.
func TestMetrics_ScrapedAndParsed(t *testing.T) {
	n := harness.Start(t, harness.Options{
		// The demo engine reports vllm:num_requests_*, so the planner has
		// the engine evidence an automatic sleep needs.
		Models: demo("m", `idle_timeout = "2s"`),
	})
	ctx := context.Background()
	for range 2 {
		if r := post(ctx, n, "m", harness.Chat("m", false, 2)); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request: %v", r)
		}
	}
	// The engine's own 400 counts for the model; an unknown model's 404
	// makes no series (clients choose those names).
	if r := post(ctx, n, "m", `{"model":"m","max_tokens":"many","messages":[]}`); r.status != http.StatusBadRequest {
		t.Fatalf("request the engine refuses: %v", r)
	}
	if r := post(ctx, n, "nosuch", harness.Chat("nosuch", false, 2)); r.status != http.StatusNotFound {
		t.Fatalf("unknown model: %v", r)
	}
	m := map[string]string{"model": "m"}
	with := func(k, v string) map[string]string { return map[string]string{"model": "m", k: v} }

	// Awake, measured by the planner's probes (every 2s).
	var fams map[string]*dto.MetricFamily
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams = scrape(t, n)
		if sample(fams, "napd_engine_memory_bytes", m) != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v := value(sample(fams, "napd_engine_memory_bytes", m)); v <= 0 {
		t.Errorf("napd_engine_memory_bytes{model=m} = %v, want the engine's RSS", v)
	}
	if v := value(sample(fams, "napd_model_state", with("state", "awake"))); v != 1 {
		t.Errorf("napd_model_state{state=awake} = %v, want 1", v)
	}
	if v := value(sample(fams, "napd_model_state", with("state", "sleeping"))); v != 0 {
		t.Errorf("napd_model_state{state=sleeping} = %v, want 0", v)
	}
	if v := value(sample(fams, "napd_wakes_total", with("result", "ok"))); v != 1 {
		t.Errorf("napd_wakes_total{result=ok} = %v, want 1", v)
	}
	h := sample(fams, "napd_wake_duration_seconds", m)
	if h == nil || h.Histogram == nil || h.Histogram.GetSampleCount() != 1 || h.Histogram.GetSampleSum() < 0.2 {
		t.Errorf("napd_wake_duration_seconds{model=m} = %v, want one wake of >= 200ms", h)
	}
	if v := value(sample(fams, "napd_requests_total", with("code", "200"))); v != 2 {
		t.Errorf("napd_requests_total{code=200} = %v, want 2", v)
	}
	if v := value(sample(fams, "napd_requests_total", with("code", "400"))); v != 1 {
		t.Errorf("napd_requests_total{code=400} = %v, want 1", v)
	}
	if s := sample(fams, "napd_requests_total", map[string]string{"model": "nosuch"}); s != nil {
		t.Errorf("an unknown model has a series: %v", s)
	}
	for _, g := range []string{"napd_queue_depth", "napd_leases_in_flight"} {
		if v := value(sample(fams, g, m)); v != 0 {
			t.Errorf("%s{model=m} = %v, want 0", g, v)
		}
	}
	for name, typ := range map[string]dto.MetricType{
		"napd_model_state": dto.MetricType_GAUGE, "napd_wakes_total": dto.MetricType_COUNTER,
		"napd_wake_duration_seconds": dto.MetricType_HISTOGRAM, "napd_requests_total": dto.MetricType_COUNTER,
		"napd_queue_depth": dto.MetricType_GAUGE, "napd_leases_in_flight": dto.MetricType_GAUGE,
		"napd_engine_memory_bytes": dto.MetricType_GAUGE,
	} {
		if f := fams[name]; f == nil || f.GetType() != typ || f.GetHelp() == "" {
			t.Errorf("%s: family %v, want type %v with help", name, f, typ)
		}
	}

	// Idle past its 2s timeout: the planner puts it to sleep.
	deadline = time.Now().Add(15 * time.Second)
	for {
		fams = scrape(t, n)
		if value(sample(fams, "napd_sleeps_total", with("reason", "idle"))) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v := value(sample(fams, "napd_sleeps_total", with("reason", "idle"))); v != 1 {
		t.Fatalf("napd_sleeps_total{reason=idle} = %v, want 1", v)
	}
	if v := value(sample(fams, "napd_planner_decisions_total", map[string]string{"model": "m", "action": "sleep", "reason": "idle"})); v < 1 {
		t.Errorf("napd_planner_decisions_total{action=sleep,reason=idle} = %v, want >= 1", v)
	}
	if v := value(sample(fams, "napd_model_state", with("state", "sleeping"))); v != 1 {
		t.Errorf("napd_model_state{state=sleeping} after the idle sleep = %v, want 1", v)
	}
}

// The engines' own metrics on the metrics listener (/metrics/engines):
// nothing for a sleeping model, and no wake for it; an awake engine's,
// labelled with its model, read without a lease or a counted request, so
// a Prometheus job scraping them all the time keeps no model awake: the
// model still goes to sleep at its idle timeout.
func TestMetrics_EnginesWithoutWake(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: demo("m", `idle_timeout = "3s"`)})
	engines := func(query string) map[string]*dto.MetricFamily {
		t.Helper()
		resp, err := http.Get("http://" + n.Metrics + "/metrics/engines" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics/engines%s: %s", query, resp.Status)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		return fams
	}
	if fams := engines(""); len(fams) != 0 {
		t.Fatalf("a sleeping model's engine metrics: %v; want none", fams)
	}
	if fams := engines("?model=m"); len(fams) != 0 {
		t.Fatalf("?model=m asleep: %v; want none", fams)
	}
	if st := n.ModelStatus("m").State; st != "sleeping" {
		t.Fatalf("after the scrapes m is %s; want it left asleep", st)
	}
	if r := post(context.Background(), n, "m", harness.Chat("m", false, 2)); r.status != http.StatusOK {
		t.Fatalf("request: %v", r)
	}
	fams := engines("")
	if s := sample(fams, "vllm:num_requests_running", map[string]string{"model": "m", "model_name": "m"}); s == nil {
		t.Fatalf("an awake engine's vllm:num_requests_running{model=m} missing: %v", fams)
	}
	if v := value(sample(fams, "napd_engine_metrics_up", map[string]string{"model": "m"})); v != 1 {
		t.Errorf("napd_engine_metrics_up{model=m} = %v, want 1", v)
	}
	// Scraped all the time, the model still sleeps at its idle timeout.
	deadline := time.Now().Add(20 * time.Second)
	for n.ModelStatus("m").State != "sleeping" {
		if time.Now().After(deadline) {
			t.Fatal("scraping its engine's metrics kept m awake")
		}
		engines("?model=m")
		time.Sleep(200 * time.Millisecond)
	}
	napd := scrape(t, n)
	if v := value(sample(napd, "napd_requests_total", map[string]string{"model": "m", "code": "200"})); v != 1 {
		t.Errorf("napd_requests_total{code=200} = %v; want only the one request, no scrape", v)
	}
	if v := value(sample(napd, "napd_wakes_total", map[string]string{"model": "m", "result": "ok"})); v != 1 {
		t.Errorf("napd_wakes_total{ok} = %v; want the request's wake only", v)
	}
}
