package demoengine

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Flavors: which engine's status and metric endpoints the emulator serves
// beside the OpenAI API, in that engine's documented formats.
const (
	// FlavorVLLM: vLLM's /metrics and, with SleepMode, its sleep endpoints.
	FlavorVLLM = "vllm"
	// FlavorLlamaCpp: llama.cpp's server: /health with its JSON bodies,
	// /slots, /props, /tokenize, /completion, and /metrics with the
	// llamacpp: prefix when Metrics is set (llama.cpp's --metrics; else
	// 501), in the shapes a real llama-server answers
	// (testdata/llamacpp); with SleepIdle, its own idle sleep.
	FlavorLlamaCpp = "llamacpp"
	// FlavorTGI: text-generation-inference: /metrics with tgi_queue_size
	// and tgi_batch_current_size; it listens only once loaded (the
	// command delays its listen by the startup delay).
	FlavorTGI = "tgi"
	// FlavorOllama: Ollama's "/" and /api/version, and /api/ps listing the
	// models it holds with their expires_at; no /metrics and no /health.
	FlavorOllama = "ollama"
	// FlavorGeneric: an OpenAI-compatible server with /health and no
	// metrics at all.
	FlavorGeneric = "generic"
)

// Flavors lists the flavors, the default first.
var Flavors = []string{FlavorVLLM, FlavorLlamaCpp, FlavorTGI, FlavorOllama, FlavorGeneric}

// OllamaKeepAlive is how long the emulated Ollama holds a model after its
// last request (Ollama's default keep_alive).
const OllamaKeepAlive = 5 * time.Minute

// flavorRoutes adds the flavor's own endpoints.
func (e *Engine) flavorRoutes(mux *http.ServeMux) {
	switch e.opts.Flavor {
	case FlavorVLLM:
		mux.Handle("GET /metrics", e.loaded(http.HandlerFunc(e.metrics)))
	case FlavorLlamaCpp:
		e.llamacppRoutes(mux)
	case FlavorTGI:
		mux.Handle("GET /metrics", e.loaded(http.HandlerFunc(e.tgiMetrics)))
	case FlavorOllama:
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "Ollama is running")
		})
		mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"version": "0.0.0-napd-demo"})
		})
		mux.Handle("GET /api/ps", e.loaded(http.HandlerFunc(e.ollamaPS)))
	}
}

// healthBody answers /health as the flavor does once the busy and hang
// options let it answer at all.
func (e *Engine) healthBody(w http.ResponseWriter) {
	loading := e.loading()
	switch {
	case e.opts.Flavor == FlavorLlamaCpp && loading:
		llamacppLoading(w)
	case e.opts.Flavor == FlavorLlamaCpp:
		// Also while it sleeps by itself: /health never wakes it.
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case loading:
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// exposition writes Prometheus text: one sample per metric, no labels.
type exposition struct{ b strings.Builder }

func (x *exposition) add(kind, name, help string, v float64) {
	fmt.Fprintf(&x.b, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, kind, name, strconv.FormatFloat(v, 'g', -1, 64))
}

func (x *exposition) write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(w, x.b.String())
}

// tgiMetrics is TGI's /metrics (docs/source/reference/metrics.md).
func (e *Engine) tgiMetrics(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	running, waiting, done := e.running, e.waiting, e.stats.Completions
	e.mu.Unlock()
	var x exposition
	x.add("counter", "tgi_request_count", "Total number of requests.", float64(done+running))
	x.add("gauge", "tgi_queue_size", "Current queue size.", float64(waiting))
	x.add("gauge", "tgi_batch_current_size", "Current batch size.", float64(running))
	x.add("gauge", "tgi_batch_current_max_tokens", "Maximum tokens for the current batch.", float64(running*maxModelLen))
	x.write(w)
}

// ollamaPS is Ollama's GET /api/ps: a model is held from its first request
// until OllamaKeepAlive after its last one (while one runs, it stays).
func (e *Engine) ollamaPS(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		Name          string         `json:"name"`
		Model         string         `json:"model"`
		Size          int64          `json:"size"`
		Digest        string         `json:"digest"`
		Details       map[string]any `json:"details"`
		ExpiresAt     time.Time      `json:"expires_at"`
		SizeVRAM      int64          `json:"size_vram"`
		ContextLength int            `json:"context_length"`
	}
	e.mu.Lock()
	used, busy, last := e.admitted > 0, len(e.jobs) > 0, e.lastEnd
	e.mu.Unlock()
	list := struct {
		Models []model `json:"models"`
	}{Models: []model{}}
	expires := last.Add(OllamaKeepAlive)
	if used && (busy || time.Now().Before(expires)) {
		if busy {
			expires = time.Now().Add(OllamaKeepAlive)
		}
		for _, name := range e.opts.Models {
			list.Models = append(list.Models, model{Name: name, Model: name, Size: e.opts.MemoryBytes,
				Digest:  "0000000000000000000000000000000000000000000000000000000000000000",
				Details: map[string]any{"format": "gguf"}, ExpiresAt: expires.UTC(), ContextLength: maxModelLen})
		}
	}
	writeJSON(w, http.StatusOK, list)
}
