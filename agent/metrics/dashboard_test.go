package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
)

// dashboard is the Grafana dashboard shipped in the package.
var dashboard = filepath.Join("..", "..", "packaging", "grafana", "napd.json")

// Every query of the shipped dashboard names metrics napd exports, with
// labels those metrics have: a renamed metric or label breaks this test,
// not the operator's dashboard.
func TestDashboard_QueriesUseExportedMetrics(t *testing.T) {
	exported := everyFamily(t)
	data, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	var queries []string
	walk(doc, func(key, v string) {
		if key == "expr" || key == "definition" {
			queries = append(queries, v)
		}
	})
	if len(queries) < 15 {
		t.Fatalf("found %d queries in %s", len(queries), dashboard)
	}
	used := map[string]bool{}
	for _, q := range queries {
		labels := map[string]bool{"le": true}
		names := metricName.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("query %q names no napd metric", q)
		}
		for _, n := range names {
			f := family(exported, n)
			if f == nil {
				t.Errorf("query %q: napd exports no metric %s", q, n)
				continue
			}
			used[f.GetName()] = true
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = true
			}
		}
		for _, l := range labelsIn(q) {
			if !labels[l] {
				t.Errorf("query %q: label %q is not a label of %v", q, l, names)
			}
		}
	}
	// What the issue asks the dashboard to show.
	for _, want := range []string{"napd_model_state", "napd_wakes_total", "napd_sleeps_total", "napd_gpu_memory_used_bytes",
		"napd_queue_depth", "napd_request_duration_seconds", "napd_request_first_byte_seconds",
		"napd_request_queue_wait_seconds", "napd_request_wake_wait_seconds", "napd_prompt_tokens_total"} {
		if !used[want] {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}

var (
	metricName = regexp.MustCompile(`\bnapd_[a-zA-Z0-9_]+`)
	byClause   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	selector   = regexp.MustCompile(`\{[^}]*\}`)
	labelCall  = regexp.MustCompile(`label_values\([^,]*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// labelsIn lists the label names a query groups by or matches on.
func labelsIn(q string) []string {
	var out []string
	for _, m := range byClause.FindAllStringSubmatch(q, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	for _, sel := range selector.FindAllString(q, -1) {
		for _, m := range matcher.FindAllStringSubmatch(sel, -1) {
			out = append(out, m[1])
		}
	}
	for _, m := range labelCall.FindAllStringSubmatch(q, -1) {
		out = append(out, m[1])
	}
	return out
}

// family finds a metric by its name in a query: a histogram's series carry
// the _bucket, _sum and _count suffixes.
func family(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if f := fams[name]; f != nil {
		return f
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f := fams[strings.TrimSuffix(name, suffix)]; f != nil && f.GetType() == dto.MetricType_HISTOGRAM && strings.HasSuffix(name, suffix) {
			return f
		}
	}
	return nil
}

// everyFamily scrapes a Metrics in which every napd metric has a series.
func everyFamily(t *testing.T) map[string]*dto.MetricFamily {
	m := New(func() Snapshot {
		return Snapshot{
			Models:        []Model{{Name: "a", State: lifecycle.Awake, EngineBytes: 1, GPUBytes: map[string]int64{"0": 1}}},
			GPUs:          []GPU{{Index: "0", Total: 2, Used: 1}},
			HostAvailable: 1, HavePSI: true,
			Usage: []KeyUsage{{Key: "c", Model: "a", ByteSeconds: 1, Wakes: 1, Swaps: 1}},
		}
	})
	m.Request(gateway.Observation{Model: "a", Client: "c", Kind: request.Chat, Status: 200, Admitted: true,
		Duration: time.Second, FirstByte: time.Second, WakeWait: time.Second, HasUsage: true})
	m.Request(gateway.Observation{Model: "a", Client: "c", Kind: request.Chat, Status: 200, Admitted: true, ServedBy: "cloud"})
	m.Wakes.WithLabelValues("a", "ok").Inc()
	m.WakeTime.WithLabelValues("a").Observe(1)
	m.Sleeps.WithLabelValues("a", "idle").Inc()
	m.Decisions.WithLabelValues("a", "sleep", "idle").Inc()
	m.Reloads.WithLabelValues("ok").Inc()
	m.RoomWaits.WithLabelValues("a").Inc()
	m.RoomWait.WithLabelValues("a").Observe(1)
	m.Swaps.WithLabelValues("a", "yield").Inc()
	fams := scrape(t, m)
	for name := range fams {
		if !strings.HasPrefix(name, "napd_") {
			delete(fams, name)
		}
	}
	return fams
}

// walk calls f for every string value in a decoded JSON document, with
// its object key ("" in arrays).
func walk(v any, f func(key, value string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok {
				f(k, s)
			} else {
				walk(e, f)
			}
		}
	case []any:
		for _, e := range v {
			walk(e, f)
		}
	}
}
