package demoengine

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestFlavor_EndpointsServed(t *testing.T) {
	tests := []struct {
		opts  Options
		path  string
		code  int
		inBdy string
	}{
		{Options{}, "/metrics", 200, "vllm:num_requests_running"},
		{Options{}, "/slots", 404, ""},
		{Options{Flavor: FlavorGeneric}, "/metrics", 404, ""},
		{Options{Flavor: FlavorGeneric}, "/health", 200, ""},
		{Options{Flavor: FlavorLlamaCpp}, "/metrics", 501, "Start it with `--metrics`"},
		{Options{Flavor: FlavorLlamaCpp, Metrics: true}, "/metrics", 200, "llamacpp:requests_processing 0"},
		{Options{Flavor: FlavorLlamaCpp}, "/health", 200, `{"status":"ok"}`},
		{Options{Flavor: FlavorLlamaCpp, MaxNumSeqs: 2}, "/slots", 200, `"is_processing":false`},
		{Options{Flavor: FlavorLlamaCpp, StartupDelay: time.Hour}, "/health", 503, `"message":"Loading model"`},
		{Options{Flavor: FlavorTGI}, "/metrics", 200, "tgi_queue_size 0"},
		{Options{Flavor: FlavorOllama}, "/", 200, "Ollama is running"},
		{Options{Flavor: FlavorOllama}, "/api/version", 200, `"version"`},
		{Options{Flavor: FlavorOllama}, "/api/ps", 200, `{"models":[]}`},
		{Options{Flavor: FlavorOllama}, "/health", 404, ""},
		{Options{Flavor: FlavorOllama}, "/metrics", 404, ""},
	}
	for _, tt := range tests {
		rec := do(newEngine(tt.opts).Handler(), "GET", tt.path, "")
		if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.inBdy) {
			t.Errorf("%s GET %s = %d %q, want %d with %q", tt.opts.Flavor, tt.path, rec.Code, rec.Body, tt.code, tt.inBdy)
		}
	}
}

func TestFlavor_BusyCountsAndProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{Flavor: FlavorLlamaCpp, Metrics: true, MaxNumSeqs: 1, TTFT: time.Second, TokensPerSecond: 1})
		h := e.Handler()
		a := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":3}`)
		synctest.Wait() // a holds the only slot
		b := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		time.Sleep(1500 * time.Millisecond) // one token of a generated
		synctest.Wait()
		m := do(h, "GET", "/metrics", "").Body.String()
		for _, want := range []string{"llamacpp:requests_processing 1", "llamacpp:requests_deferred 1", "llamacpp:tokens_predicted_total 1"} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %q:\n%s", want, m)
			}
		}
		slots := decode[[]struct {
			IsProcessing bool `json:"is_processing"`
			NextToken    []struct {
				NDecoded int `json:"n_decoded"`
			} `json:"next_token"`
		}](t, do(h, "GET", "/slots", ""))
		if len(slots) != 1 || !slots[0].IsProcessing || slots[0].NextToken[0].NDecoded != 1 {
			t.Errorf("slots = %+v, want one busy slot with 1 token decoded", slots)
		}
		wantCode(t, <-a, http.StatusOK)
		wantCode(t, <-b, http.StatusOK)
		if m := do(h, "GET", "/metrics", "").Body.String(); !strings.Contains(m, "llamacpp:tokens_predicted_total 4") {
			t.Errorf("after both: %s", m)
		}
	})
}

func TestFlavor_TGIQueueAndBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newEngine(Options{Flavor: FlavorTGI, MaxNumSeqs: 1, TTFT: time.Second}).Handler()
		a := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		synctest.Wait()
		b := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		synctest.Wait()
		m := do(h, "GET", "/metrics", "").Body.String()
		if !strings.Contains(m, "tgi_batch_current_size 1") || !strings.Contains(m, "tgi_queue_size 1") {
			t.Errorf("metrics:\n%s", m)
		}
		<-a
		<-b
	})
}

func TestFlavor_OllamaHoldsAfterUseUntilKeepAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newEngine(Options{Flavor: FlavorOllama, Models: []string{"qwen2.5:0.5b"}, TTFT: time.Second}).Handler()
		wantCode(t, do(h, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1}`), http.StatusOK)
		type ps struct {
			Models []struct {
				Name      string    `json:"name"`
				ExpiresAt time.Time `json:"expires_at"`
			} `json:"models"`
		}
		got := decode[ps](t, do(h, "GET", "/api/ps", ""))
		if len(got.Models) != 1 || got.Models[0].Name != "qwen2.5:0.5b" || !got.Models[0].ExpiresAt.Equal(time.Now().Add(OllamaKeepAlive)) {
			t.Fatalf("/api/ps = %+v, want the model until %v", got, time.Now().Add(OllamaKeepAlive))
		}
		time.Sleep(OllamaKeepAlive)
		if got := decode[ps](t, do(h, "GET", "/api/ps", "")); len(got.Models) != 0 {
			t.Fatalf("/api/ps after keep_alive = %+v, want none", got)
		}
	})
}

func TestFlavor_BusyHealth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newEngine(Options{Flavor: FlavorGeneric, BusyHealth: true, TTFT: time.Minute}).Handler()
		wantCode(t, do(h, "GET", "/health", ""), http.StatusOK)
		a := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		synctest.Wait()
		health := async(t.Context(), h, "GET", "/health", "")
		time.Sleep(30 * time.Second)
		synctest.Wait()
		select {
		case rec := <-health:
			t.Fatalf("/health answered %d while busy", rec.Code)
		default:
		}
		wantCode(t, <-a, http.StatusOK)
		wantCode(t, do(h, "GET", "/health", ""), http.StatusOK)
	})
}
