package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/napd/napd/internal/httpfixture"
	"github.com/napd/napd/probes/enginemetrics"
)

// engine serves one exposition and counts its scrapes.
func engine(t *testing.T, contentType, body string) (string, *atomic.Int32) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", contentType)
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &hits
}

func parseText(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%v in:\n%s", err, text)
	}
	return fams
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestEnginesHandler(t *testing.T) {
	llama := httpfixture.Load(t, "../../testdata/llamacpp/metrics-busy.http")
	llamaURL, llamaHits := engine(t, llama.Header.Get("Content-Type"), string(llama.Body))
	// An engine with a model label of its own, and a family that clashes
	// in type with llama.cpp's.
	otherURL, _ := engine(t, "text/plain; version=0.0.4", "# TYPE queue gauge\nqueue{model=\"inner\"} 3\n"+
		"# TYPE llamacpp:requests_processing counter\nllamacpp:requests_processing 9\n")
	broken, _ := engine(t, "text/plain", "this is { not metrics")
	var asleepHits atomic.Int32
	targets := func() []EngineTarget {
		return []EngineTarget{{"llama", llamaURL + "/"}, {"other", otherURL}, {"asleep", ""}, {"broken", broken}}
	}
	s := &enginemetrics.Scraper{}
	scrape := func(ctx context.Context, url string) ([]*dto.MetricFamily, error) {
		if url == "" {
			asleepHits.Add(1)
			return nil, errors.New("asked an engine that does not serve")
		}
		return s.Families(ctx, url)
	}
	h := EnginesHandler(targets, scrape, slog.New(slog.DiscardHandler))
	get := func(target string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
		return rec
	}

	rec := get(EnginesPath)
	if rec.Code != 200 {
		t.Fatalf("GET %s = %d %s", EnginesPath, rec.Code, rec.Body)
	}
	fams := parseText(t, rec.Body.String())
	busy := fams["llamacpp:requests_processing"]
	if busy.GetType() != dto.MetricType_GAUGE || len(busy.Metric) != 1 || labels(busy.Metric[0])["model"] != "llama" || busy.Metric[0].GetGauge().GetValue() != 1 {
		t.Errorf("llamacpp:requests_processing = %v; want llama's gauge at 1, other's counter left out", busy)
	}
	q := fams["queue"]
	if len(q.GetMetric()) != 1 || labels(q.Metric[0])["model"] != "other" || labels(q.Metric[0])["exported_model"] != "inner" {
		t.Errorf("queue = %v; want model=other and the engine's own label as exported_model", q)
	}
	for name, f := range fams {
		for _, m := range f.Metric {
			if labels(m)["model"] == "" {
				t.Errorf("%s: a sample without a model label", name)
			}
			if labels(m)["model"] == "asleep" {
				t.Errorf("%s: a sample of the sleeping model", name)
			}
		}
	}
	up := map[string]float64{}
	for _, m := range fams[EngineUp].GetMetric() {
		up[labels(m)["model"]] = m.GetGauge().GetValue()
	}
	if up["llama"] != 1 || up["other"] != 1 || up["broken"] != 0 {
		t.Errorf("%s = %v; want llama and other 1, broken 0", EngineUp, up)
	}
	if _, ok := up["asleep"]; ok || asleepHits.Load() != 0 {
		t.Errorf("the sleeping model was asked (%d) or has an up series (%v)", asleepHits.Load(), up)
	}

	before := llamaHits.Load()
	one := parseText(t, get(EnginesPath+"?model=llama").Body.String())
	for name, f := range one {
		for _, m := range f.Metric {
			if labels(m)["model"] != "llama" {
				t.Errorf("?model=llama: %s has model %q", name, labels(m)["model"])
			}
		}
	}
	if llamaHits.Load() != before+1 {
		t.Errorf("?model=llama scraped the engine %d times, want once", llamaHits.Load()-before)
	}
	if rec := get(EnginesPath + "?model=asleep"); rec.Code != 200 || rec.Body.Len() != 0 {
		t.Errorf("?model=asleep = %d %q; want 200 and no samples", rec.Code, rec.Body)
	}
	if rec := get(EnginesPath + "?model=nosuch"); rec.Code != 404 {
		t.Errorf("?model=nosuch = %d, want 404", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", EnginesPath, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST = %d, want 405", rec.Code)
	}
}

func TestScrapeTimeout(t *testing.T) {
	for hdr, want := range map[string]string{"": "5s", "10": "9s", "0.05": "100ms", "120": "10s", "nope": "5s"} {
		r := httptest.NewRequest("GET", "/", nil)
		if hdr != "" {
			r.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", hdr)
		}
		if got := scrapeTimeout(r).String(); got != want {
			t.Errorf("timeout header %q: %s, want %s", hdr, got, want)
		}
	}
}
