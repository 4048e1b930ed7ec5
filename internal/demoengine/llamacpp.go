package demoengine

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"time"
)

// The llama.cpp flavor answers in the shapes a real llama-server answers
// (testdata/llamacpp, checked by TestLlamaCpp_ShapesAsRecorded): its
// endpoints, its 503 while loading, and its own idle sleep.

// llamacppRoutes adds llama.cpp's own endpoints. /slots and /tokenize are
// tasks (they wake an engine asleep by itself and count as activity);
// /health, /props and /metrics are not, as in llama.cpp.
func (e *Engine) llamacppRoutes(mux *http.ServeMux) {
	mux.Handle("GET /metrics", e.loaded(http.HandlerFunc(e.llamacppMetrics)))
	mux.Handle("GET /slots", e.loaded(http.HandlerFunc(e.slotList)))
	mux.Handle("GET /props", e.loaded(http.HandlerFunc(e.props)))
	mux.Handle("POST /tokenize", e.loaded(http.HandlerFunc(e.tokenize)))
	mux.Handle("POST /completion", e.loaded(http.HandlerFunc(e.llamacppCompletion)))
}

// llamacppLoading is llama.cpp's answer on every route while it loads.
func llamacppLoading(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, `{"error":{"message":"Loading model","type":"unavailable_error","code":503}}`)
}

// llamacppFamilies are the families of llama.cpp's /metrics, in its order,
// with its help texts and types.
var llamacppFamilies = []struct{ name, kind, help string }{
	{"llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"},
	{"llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"},
	{"llamacpp:prompt_seconds_total", "counter", "Total time spent processing prompts"},
	{"llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed"},
	{"llamacpp:tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"},
	{"llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"},
	{"llamacpp:n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"},
	{"llamacpp:spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"},
	{"llamacpp:spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens accepted by the target model"},
	{"llamacpp:spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"},
	{"llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"},
	{"llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"},
	{"llamacpp:requests_processing", "gauge", "Number of requests processing"},
	{"llamacpp:requests_deferred", "gauge", "Number of requests deferred"},
	{"llamacpp:n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"},
}

// llamacppMetrics is llama.cpp's /metrics: requests_processing counts busy
// slots, requests_deferred the requests waiting for one; the counters grow
// with the tokens generated. It does not wake an engine asleep by itself.
func (e *Engine) llamacppMetrics(w http.ResponseWriter, _ *http.Request) {
	if !e.opts.Metrics {
		writeJSON(w, http.StatusNotImplemented, map[string]any{"error": map[string]any{
			"code": 501, "message": "This server does not support metrics endpoint. Start it with `--metrics`", "type": "not_supported_error"}})
		return
	}
	e.mu.Lock()
	values := map[string]float64{
		"llamacpp:tokens_predicted_total": float64(e.generated),
		"llamacpp:n_decode_total":         float64(e.generated),
		"llamacpp:requests_processing":    float64(e.running),
		"llamacpp:requests_deferred":      float64(e.waiting),
	}
	e.mu.Unlock()
	var x exposition
	for _, f := range llamacppFamilies {
		x.add(f.kind, f.name, f.help, values[f.name])
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	io.WriteString(w, x.b.String())
}

// props is llama.cpp's GET /props: its settings, slot count and whether it
// sleeps by itself.
func (e *Engine) props(w http.ResponseWriter, _ *http.Request) {
	path := "/srv/models/" + e.opts.Models[0] + ".gguf"
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{"params": map[string]int{"n_predict": -1}, "n_ctx": maxModelLen},
		"total_slots":                 e.opts.MaxNumSeqs,
		"model_alias":                 path,
		"model_path":                  path,
		"modalities":                  map[string]bool{"vision": false, "video": false, "audio": false},
		"endpoint_slots":              true,
		"endpoint_props":              false,
		"endpoint_metrics":            e.opts.Metrics,
		"build_info":                  "napd-demo-engine",
		"is_sleeping":                 e.Stats().IsSleeping,
	})
}

// tokenize is llama.cpp's POST /tokenize: one token per word. It is a task:
// an engine asleep by itself reloads first (napd's wake of such an engine
// is an empty one).
func (e *Engine) tokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Content json.RawMessage `json:"content"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	if e.task(r.Context()) != nil {
		return // the client left while it reloaded
	}
	n := 0
	if len(req.Content) > 0 {
		var err error
		if n, err = promptTokens(req.Content); err != nil {
			writeError(w, http.StatusBadRequest, "content: "+err.Error())
			return
		}
	}
	tokens := make([]int, n)
	for i := range tokens {
		tokens[i] = i + 1
	}
	writeJSON(w, http.StatusOK, map[string][]int{"tokens": tokens})
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
// ones first with is_processing, their task and decoded token count; an
// idle slot has only its id, context and flags. It is a task, as in
// llama.cpp: it wakes an engine asleep by itself and holds off its sleep.
func (e *Engine) slotList(w http.ResponseWriter, r *http.Request) {
	if e.task(r.Context()) != nil {
		return
	}
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
		HasNextToken bool `json:"has_next_token"`
		HasNewLine   bool `json:"has_new_line"`
		NRemain      int  `json:"n_remain"`
		NDecoded     int  `json:"n_decoded"`
	}
	type slot struct {
		ID           int            `json:"id"`
		NCtx         int            `json:"n_ctx"`
		Speculative  bool           `json:"speculative"`
		IsProcessing bool           `json:"is_processing"`
		IDTask       *int           `json:"id_task,omitempty"`
		Params       map[string]any `json:"params,omitempty"`
		NextToken    []nextToken    `json:"next_token,omitempty"`
	}
	out := make([]slot, e.opts.MaxNumSeqs)
	for i := range out {
		out[i] = slot{ID: i, NCtx: maxModelLen}
		if i < len(decoded) {
			task := i
			out[i].IsProcessing, out[i].IDTask = true, &task
			out[i].Params = map[string]any{"n_predict": -1}
			out[i].NextToken = []nextToken{{HasNextToken: true, NRemain: -1, NDecoded: decoded[i]}}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// idleSleep is llama.cpp's own idle sleep (--sleep-idle-seconds): once no
// task came for SleepIdle, the engine frees its weights by itself and
// /props says is_sleeping; the next task reloads them (taking WakeDelay)
// and waits for that. /health, /props and /metrics are not tasks. Guarded
// by the engine's mutex.
type idleSleep struct {
	asleep    bool
	lastTask  time.Time
	timer     *time.Timer
	reloading chan struct{} // closed when the reload under way ends; nil when none
}

// startIdleSleep arms the idle sleep: the first check is due SleepIdle
// after the engine has loaded.
func (e *Engine) startIdleSleep() {
	if e.opts.SleepIdle <= 0 {
		return
	}
	e.selfSleep.lastTask = e.started.Add(e.opts.StartupDelay)
	e.selfSleep.timer = time.AfterFunc(e.opts.StartupDelay+e.opts.SleepIdle, e.idleCheck)
}

// idleCheck puts the engine to sleep when no task came for SleepIdle and
// none runs; otherwise it looks again when that may be so.
func (e *Engine) idleCheck() {
	e.mu.Lock()
	if e.selfSleep.asleep || e.selfSleep.reloading != nil || len(e.jobs) > 0 {
		e.mu.Unlock() // a task's end arms the check again
		return
	}
	if left := e.opts.SleepIdle - time.Since(e.selfSleep.lastTask); left > 0 {
		e.selfSleep.timer.Reset(left)
		e.mu.Unlock()
		return
	}
	e.selfSleep.asleep = true
	e.weights = nil
	e.stats.SelfSleeps++
	e.mu.Unlock()
	debug.FreeOSMemory()
	e.log.Info("entering sleeping state", "idle", e.opts.SleepIdle)
}

// task records a task's arrival and, when the engine sleeps by itself,
// reloads it and waits for that (or for ctx).
func (e *Engine) task(ctx context.Context) error {
	if e.opts.SleepIdle <= 0 {
		return nil
	}
	e.mu.Lock()
	for {
		e.selfSleep.lastTask = time.Now()
		if !e.selfSleep.asleep {
			e.mu.Unlock()
			return nil
		}
		if e.selfSleep.reloading == nil {
			e.selfSleep.reloading = make(chan struct{})
			go e.reload()
		}
		done := e.selfSleep.reloading
		e.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		e.mu.Lock()
	}
}

// reload brings the weights back after an idle sleep.
func (e *Engine) reload() {
	if e.opts.WakeDelay > 0 {
		time.Sleep(e.opts.WakeDelay) // a reload cannot be cut short, as in llama.cpp
	}
	weights := allocate(e.opts.MemoryBytes)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.weights, e.selfSleep.asleep = weights, false
	e.selfSleep.lastTask = time.Now()
	close(e.selfSleep.reloading)
	e.selfSleep.reloading = nil
	e.stats.Reloads++
	e.selfSleep.timer.Reset(e.opts.SleepIdle)
	e.log.Info("exiting sleeping state")
}

// taskEndedLocked arms the idle check once the last task ended; the caller
// holds the engine's mutex.
func (e *Engine) taskEndedLocked() {
	if e.selfSleep.timer != nil && len(e.jobs) == 0 {
		e.selfSleep.lastTask = time.Now()
		e.selfSleep.timer.Reset(e.opts.SleepIdle)
	}
}
