package demoengine

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
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
	// /slots, and /metrics with the llamacpp: prefix when Metrics is set
	// (llama.cpp's --metrics; else 501).
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
		mux.Handle("GET /metrics", e.loaded(http.HandlerFunc(e.llamacppMetrics)))
		mux.Handle("GET /slots", e.loaded(http.HandlerFunc(e.slotList)))
		mux.Handle("GET /props", e.loaded(http.HandlerFunc(e.props)))
		mux.Handle("POST /completion", e.loaded(http.HandlerFunc(e.llamacppCompletion)))
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
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`)
	case e.opts.Flavor == FlavorLlamaCpp:
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

// llamacppMetrics is llama.cpp's /metrics (tools/server: the llamacpp:
// prefix; requests_processing counts busy slots, requests_deferred the
// requests waiting for one).
func (e *Engine) llamacppMetrics(w http.ResponseWriter, _ *http.Request) {
	if !e.opts.Metrics {
		writeJSON(w, http.StatusNotImplemented, map[string]any{"error": map[string]any{
			"code": 501, "message": "This server does not support metrics endpoint. Start it with `--metrics`", "type": "not_supported_error"}})
		return
	}
	e.mu.Lock()
	running, waiting, generated := e.running, e.waiting, e.generated
	e.mu.Unlock()
	var x exposition
	x.add("counter", "llamacpp:prompt_tokens_total", "Number of prompt tokens processed.", 0)
	x.add("counter", "llamacpp:tokens_predicted_total", "Number of generation tokens processed.", float64(generated))
	x.add("counter", "llamacpp:n_decode_total", "Total number of llama_decode() calls", float64(generated))
	x.add("gauge", "llamacpp:requests_processing", "Number of requests processing.", float64(running))
	x.add("gauge", "llamacpp:requests_deferred", "Number of requests deferred.", float64(waiting))
	x.write(w)
}

// props is llama.cpp's GET /props: its settings, slot count and whether it
// sleeps.
func (e *Engine) props(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{"n_ctx": maxModelLen, "params": map[string]int{"n_predict": -1}},
		"total_slots":                 e.opts.MaxNumSeqs,
		"model_path":                  "/models/" + e.opts.Models[0] + ".gguf",
		"is_sleeping":                 e.Stats().IsSleeping,
		"build_info":                  "napd-demo-engine",
	})
}

// llamacppCompletion is llama.cpp's native POST /completion, not streamed:
// {"prompt", "n_predict"} in, {"content", "tokens_predicted", …} out, with
// the same deterministic tokens as /v1/completions. Like llama.cpp serving
// one model, it ignores the body's model.
func (e *Engine) llamacppCompletion(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt   json.RawMessage `json:"prompt"`
		NPredict *int            `json:"n_predict"`
		Stream   bool            `json:"stream"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	n, err := promptTokens(req.Prompt)
	switch {
	case err != nil:
		writeError(w, http.StatusBadRequest, "prompt: "+err.Error())
		return
	case req.Stream:
		writeError(w, http.StatusBadRequest, "stream is not emulated on /completion")
		return
	}
	g := generation{model: e.opts.Models[0], promptTokens: n, maxTokens: defaultMaxTokens, seed: n}
	if req.NPredict != nil && *req.NPredict > 0 {
		g.maxTokens = min(*req.NPredict, maxModelLen)
	}
	e.run(w, r, g.model, func(j *job) {
		if !e.generateAll(w, j, g) {
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"content": g.text(), "model": g.model, "stop": true, "stop_type": "limit",
			"tokens_predicted": g.maxTokens, "tokens_evaluated": g.promptTokens,
		})
		e.completed()
	})
}

// slotList is llama.cpp's GET /slots: one entry per slot (MaxNumSeqs), busy
// ones first with is_processing and their decoded token count.
func (e *Engine) slotList(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	var decoded []int
	for j := range e.jobs {
		if j.running {
			decoded = append(decoded, j.decoded)
		}
	}
	e.mu.Unlock()
	slices.Sort(decoded)
	type nextToken struct {
		HasNextToken bool   `json:"has_next_token"`
		HasNewLine   bool   `json:"has_new_line"`
		NRemain      int    `json:"n_remain"`
		NDecoded     int    `json:"n_decoded"`
		StoppingWord string `json:"stopping_word"`
	}
	type slot struct {
		ID           int            `json:"id"`
		IDTask       int            `json:"id_task"`
		NCtx         int            `json:"n_ctx"`
		Speculative  bool           `json:"speculative"`
		IsProcessing bool           `json:"is_processing"`
		Params       map[string]any `json:"params"`
		NextToken    []nextToken    `json:"next_token"`
	}
	out := make([]slot, e.opts.MaxNumSeqs)
	for i := range out {
		out[i] = slot{ID: i, IDTask: -1, NCtx: maxModelLen, Params: map[string]any{"n_predict": -1},
			NextToken: []nextToken{{HasNextToken: true, NRemain: -1}}}
		if i < len(decoded) {
			out[i].IDTask, out[i].IsProcessing = i, true
			out[i].NextToken[0].NDecoded = decoded[i]
		}
	}
	writeJSON(w, http.StatusOK, out)
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
