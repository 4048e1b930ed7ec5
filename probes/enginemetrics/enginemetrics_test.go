package enginemetrics

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/napd/napd/internal/httpfixture"
)

const (
	fixtures       = "../testdata/metrics/"
	engineFixtures = "../testdata/engines/"
	// llamacpp holds a real llama-server's answers (testdata/llamacpp/README.md).
	llamacpp = "../../testdata/llamacpp/"
	promText = "text/plain; version=0.0.4; charset=utf-8"
)

var textFormat = expfmt.NewFormat(expfmt.TypeTextPlain)

func fixture(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// route is one endpoint of a fake engine.
type route struct {
	contentType string
	body        []byte
	status      int
}

// serve runs a fake engine answering routes (404 elsewhere) and counts the
// requests per path.
func serve(t *testing.T, routes map[string]route) (string, map[string]*atomic.Int32) {
	t.Helper()
	hits := map[string]*atomic.Int32{"/metrics": {}, "/slots": {}, "/api/ps": {}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := hits[r.URL.Path]; h != nil {
			h.Add(1)
		}
		rt, ok := routes[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", rt.contentType)
		if rt.status != 0 {
			w.WriteHeader(rt.status)
		}
		w.Write(rt.body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, hits
}

func metrics(t *testing.T, file, contentType string) map[string]route {
	return map[string]route{"/metrics": {contentType: contentType, body: fixture(t, fixtures+file)}}
}

// recorded is a route answering a real engine's recorded answer.
func recorded(t testing.TB, file string) route {
	r := httpfixture.Load(t, llamacpp+file)
	return route{contentType: r.Header.Get("Content-Type"), body: r.Body, status: r.Status}
}

func TestScraper_Recorded(t *testing.T) {
	ollamaHeld := []Held{
		{Name: "qwen2.5:0.5b", ExpiresAt: time.Date(2319, 3, 10, 9, 41, 7, 123456789, time.UTC)},
		{Name: "smollm:135m", ExpiresAt: time.Date(2026, 12, 1, 2, 45, 0, 500000000, time.UTC), SizeVRAM: 361394176},
	}
	tests := []struct {
		name   string
		routes map[string]route
		custom []string
		want   Evidence
		idle   bool
	}{
		{"vllm", metrics(t, "vllm.txt", promText), nil, Evidence{Engine: EngineVLLM, Counts: true, Running: 5, Waiting: 1, SleepState: "awake", Progress: 184213, HaveProgress: true}, false},
		{"vllm sleeping", metrics(t, "vllm-sleeping.txt", promText), nil, Evidence{Engine: EngineVLLM, Counts: true, SleepState: "weights_offloaded"}, true},
		{"sglang", metrics(t, "sglang.txt", promText), nil, Evidence{Engine: EngineSGLang, Counts: true, Progress: 8123, HaveProgress: true}, true},
		{"llamacpp idle", map[string]route{"/metrics": recorded(t, "metrics-idle.http")}, nil, Evidence{Engine: EngineLlamaCpp, Counts: true, HaveProgress: true}, true},
		// tokens_predicted 0, prompt_tokens 2, n_decode 1211: one long generation under way.
		{"llamacpp busy", map[string]route{"/metrics": recorded(t, "metrics-busy.http")}, nil, Evidence{Engine: EngineLlamaCpp, Counts: true, Running: 1, Progress: 2 + 1211, HaveProgress: true}, false},
		{"tgi", metrics(t, "tgi.txt", promText), nil, Evidence{Engine: EngineTGI, Counts: true, Running: 4, Waiting: 3}, false},
		{"tgi idle", metrics(t, "tgi-idle.txt", promText), nil, Evidence{Engine: EngineTGI, Counts: true}, true},
		{"custom", metrics(t, "custom.txt", promText), []string{"myengine_active_requests", "myengine_queue_size"}, Evidence{Engine: EngineCustom, Counts: true, Running: 3}, false},
		{"custom first", metrics(t, "vllm.txt", promText), []string{"vllm:num_requests_waiting"}, Evidence{Engine: EngineCustom, Counts: true, Running: 1, SleepState: "awake"}, false},
		{"openmetrics", metrics(t, "vllm.openmetrics.txt", "application/openmetrics-text; version=1.0.0; charset=utf-8"), nil, Evidence{Engine: EngineVLLM, Counts: true, Waiting: 4}, false},
		{"no content type", metrics(t, "vllm.txt", ""), nil, Evidence{Engine: EngineVLLM, Counts: true, Running: 5, Waiting: 1, SleepState: "awake", Progress: 184213, HaveProgress: true}, false},
		{"llamacpp slots without --metrics", map[string]route{
			"/metrics": {status: http.StatusNotImplemented, body: []byte(`{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with --metrics","type":"not_supported_error"}}`)},
			"/slots":   recorded(t, "slots-busy.http"),
		}, nil, Evidence{Engine: EngineLlamaCpp, Counts: true, Running: 1, Progress: 1222, HaveProgress: true}, false},
		{"llamacpp slots idle", map[string]route{
			"/metrics": {status: http.StatusNotImplemented},
			"/slots":   recorded(t, "slots-idle.http"),
		}, nil, Evidence{Engine: EngineLlamaCpp, Counts: true}, true},
		// Builds before next_token became an array of them (b5xxx) sent one object.
		{"llamacpp slots, older builds", map[string]route{"/slots": {contentType: "application/json",
			body: []byte(`[{"id":0,"is_processing":true,"next_token":{"has_next_token":true,"n_decoded":87}},{"id":1,"is_processing":false}]`)}},
			nil, Evidence{Engine: EngineLlamaCpp, Counts: true, Running: 1, Progress: 87, HaveProgress: true}, false},
		{"ollama", map[string]route{"/api/ps": {contentType: "application/json", body: fixture(t, engineFixtures+"ollama-ps.json")}}, nil, Evidence{Engine: EngineOllama, Held: ollamaHeld}, false},
		{"ollama holding nothing", map[string]route{"/api/ps": {contentType: "application/json", body: fixture(t, engineFixtures+"ollama-ps-empty.json")}}, nil, Evidence{Engine: EngineOllama, Held: []Held{}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, _ := serve(t, tt.routes)
			got, err := new(Scraper).Scrape(context.Background(), url+"/", tt.custom)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
			if got.Idle() != tt.idle {
				t.Errorf("Idle() = %v, want %v", got.Idle(), tt.idle)
			}
		})
	}
}

// An engine is asked for the endpoint that answered it, not for all of
// them each round; one without any is asked again after a while.
func TestScraper_RemembersTheEndpoint(t *testing.T) {
	now := time.Unix(1000, 0)
	s := &Scraper{Now: func() time.Time { return now }}
	ollama, hits := serve(t, map[string]route{"/api/ps": {body: fixture(t, engineFixtures+"ollama-ps-empty.json")}})
	for range 3 {
		if _, err := s.Scrape(context.Background(), ollama, nil); err != nil {
			t.Fatal(err)
		}
	}
	if m, sl, ps := hits["/metrics"].Load(), hits["/slots"].Load(), hits["/api/ps"].Load(); m != 1 || sl != 1 || ps != 3 {
		t.Errorf("asked /metrics %d, /slots %d, /api/ps %d times; want 1, 1, 3", m, sl, ps)
	}

	generic, hits := serve(t, nil)
	for range 3 {
		if ev, err := s.Scrape(context.Background(), generic, nil); err == nil || ev.Engine != "" {
			t.Fatalf("generic engine: %+v, %v; want no evidence and an error", ev, err)
		}
	}
	if m := hits["/metrics"].Load(); m != 1 {
		t.Errorf("generic engine asked %d times, want once until the recheck", m)
	}
	now = now.Add(recheck)
	s.Scrape(context.Background(), generic, nil)
	if m := hits["/metrics"].Load(); m != 2 {
		t.Errorf("after the recheck delay: asked %d times, want 2", m)
	}
}

func TestScraper_FailureIsNoEvidence(t *testing.T) {
	broken, _ := serve(t, map[string]route{"/metrics": {contentType: promText, body: []byte("vllm:num_requests_running{ 3\n")}})
	loading, hits := serve(t, map[string]route{"/metrics": {status: http.StatusServiceUnavailable, body: []byte(`{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`)}})
	missing, _ := serve(t, nil)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for name, url := range map[string]string{"malformed": broken, "loading": loading, "404": missing, "refused": closed.URL} {
		got, err := new(Scraper).Scrape(context.Background(), url, nil)
		if err == nil {
			t.Errorf("%s: want an error", name)
		}
		if got.Engine != "" || got.Have() {
			t.Errorf("%s: evidence %+v, want none", name, got)
		}
	}
	if n := hits["/slots"].Load(); n != 0 {
		t.Errorf("a loading engine was asked for /slots %d times: its 503 means not yet", n)
	}
}

func TestScraper_HonoursDeadline(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := new(Scraper).Scrape(ctx, srv.URL, nil); err == nil {
		t.Error("want a deadline error")
	}
}

func TestParse_SumsAndClamps(t *testing.T) {
	text := "vllm:num_requests_running{engine=\"0\"} 0.5\nvllm:num_requests_running{engine=\"1\"} 1\nvllm:num_requests_waiting -3\n"
	got, err := Parse(bytes.NewReader([]byte(text)), textFormat, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Running != 2 || got.Waiting != 0 {
		t.Errorf("got %+v, want running 2 (rounded up), waiting 0 (clamped)", got)
	}
}

func TestParseSlots_Malformed(t *testing.T) {
	for _, body := range []string{`{"slots":[]}`, `[{"id":0}]`, `[{"is_processing":"yes"}]`, `not json`} {
		if ev, err := ParseSlots([]byte(body)); err == nil {
			t.Errorf("%s: want an error, got %+v", body, ev)
		}
	}
}

func TestParseOllamaPS_Malformed(t *testing.T) {
	for _, body := range []string{`{}`, `[]`, `{"models":[{"expires_at":"soon"}]}`, `<html>`} {
		if ev, err := ParseOllamaPS([]byte(body)); err == nil {
			t.Errorf("%s: want an error, got %+v", body, ev)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm.txt", "vllm-sleeping.txt", "sglang.txt", "tgi.txt", "custom.txt"} {
		f.Add(fixture(f, fixtures+name), "myengine_queue_size")
	}
	for _, name := range []string{"metrics-idle.http", "metrics-busy.http"} {
		f.Add(httpfixture.Load(f, llamacpp+name).Body, "")
	}
	f.Fuzz(func(t *testing.T, text []byte, custom string) {
		ev, err := Parse(bytes.NewReader(text), textFormat, strings.Fields(custom))
		if err != nil {
			if !reflect.DeepEqual(ev, Evidence{}) {
				t.Fatalf("error %v with evidence %+v", err, ev)
			}
			return
		}
		if ev.Running < 0 || ev.Waiting < 0 || ev.Counts != (ev.Engine != "") {
			t.Fatalf("inconsistent evidence %+v", ev)
		}
	})
}

func FuzzParseSlots(f *testing.F) {
	f.Add(httpfixture.Load(f, llamacpp+"slots-busy.http").Body)
	f.Add(httpfixture.Load(f, llamacpp+"slots-idle.http").Body)
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := ParseSlots(data)
		if err == nil && (ev.Running < 0 || !ev.Counts || ev.Waiting != 0) {
			t.Fatalf("inconsistent evidence %+v", ev)
		}
	})
}

func FuzzParseOllamaPS(f *testing.F) {
	f.Add(fixture(f, engineFixtures+"ollama-ps.json"))
	f.Add(fixture(f, engineFixtures+"ollama-ps-empty.json"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := ParseOllamaPS(data)
		if err == nil && (ev.Counts || ev.Held == nil) {
			t.Fatalf("inconsistent evidence %+v", ev)
		}
	})
}

// A quiet scrape never asks /slots (a task to llama.cpp: it would wake a
// llama-server asleep by itself and hold its idle sleep off), also of an
// engine a plain scrape found there: without --metrics such an engine
// gives no evidence rather than be woken.
func TestScraper_QuietNeverAsksSlots(t *testing.T) {
	url, hits := serve(t, map[string]route{
		"/metrics": {status: http.StatusNotImplemented},
		"/slots":   recorded(t, "slots-busy.http"),
	})
	s := new(Scraper)
	if ev, err := s.Scrape(context.Background(), url, nil); err != nil || ev.Running != 1 {
		t.Fatalf("plain scrape: %+v %v", ev, err)
	}
	before := hits["/slots"].Load()
	if ev, err := s.ScrapeQuiet(context.Background(), url, nil); err == nil || ev.Have() {
		t.Errorf("quiet scrape without /metrics: %+v %v; want no evidence", ev, err)
	}
	if n := hits["/slots"].Load() - before; n != 0 {
		t.Errorf("a quiet scrape asked /slots %d times", n)
	}
	metricsURL, _ := serve(t, map[string]route{"/metrics": recorded(t, "metrics-busy.http")})
	if ev, err := s.ScrapeQuiet(context.Background(), metricsURL, nil); err != nil || ev.Running != 1 {
		t.Errorf("quiet scrape with /metrics: %+v %v", ev, err)
	}
}
