package enginemetrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/internal/demoengine"
)

// Each adapter against the demo engine's flavor of its engine: idle, then
// with one completion running.
func TestScraper_DemoFlavors(t *testing.T) {
	tests := []struct {
		name   string
		opts   demoengine.Options
		engine Engine
		counts bool
	}{
		{"vllm", demoengine.Options{}, EngineVLLM, true},
		{"llamacpp metrics", demoengine.Options{Flavor: demoengine.FlavorLlamaCpp, Metrics: true}, EngineLlamaCpp, true},
		{"llamacpp slots", demoengine.Options{Flavor: demoengine.FlavorLlamaCpp}, EngineLlamaCpp, true},
		{"tgi", demoengine.Options{Flavor: demoengine.FlavorTGI}, EngineTGI, true},
		{"ollama", demoengine.Options{Flavor: demoengine.FlavorOllama}, EngineOllama, false},
		{"generic", demoengine.Options{Flavor: demoengine.FlavorGeneric}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.TTFT = time.Hour // a completion runs until cancelled
			e := demoengine.New(tt.opts)
			srv := httptest.NewServer(e.Handler())
			defer srv.Close()
			s := new(Scraper)
			ev, err := s.Scrape(context.Background(), srv.URL, nil)
			if ev.Engine != tt.engine || ev.Counts != tt.counts || (tt.counts && !ev.Idle()) {
				t.Fatalf("idle engine: %+v (%v); want engine %q, counts %v, idle", ev, err, tt.engine, tt.counts)
			}

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			defer func() { cancel(); <-done }()
			deadline := time.Now().Add(10 * time.Second)
			for e.Stats().Running != 1 {
				if time.Now().After(deadline) {
					t.Fatal("the completion never ran")
				}
				time.Sleep(time.Millisecond)
			}
			ev, err = s.Scrape(context.Background(), srv.URL, nil)
			if tt.counts && (err != nil || ev.Running != 1 || ev.Idle()) {
				t.Errorf("busy engine: %+v (%v); want 1 running", ev, err)
			}
			if tt.engine == EngineOllama && (len(ev.Held) != 1 || ev.Held[0].Name != "demo") {
				t.Errorf("busy Ollama: %+v; want it to hold demo", ev)
			}
		})
	}
}
