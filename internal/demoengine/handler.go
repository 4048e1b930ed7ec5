package demoengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxBody bounds request bodies; the emulator needs none larger.
const maxBody = 16 << 20

// maxControlBody bounds the control bodies /debug/requests keeps.
const maxControlBody = 4 << 10

// Handler returns the engine's HTTP API.
func (e *Engine) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", e.health)
	mux.Handle("GET /v1/models", e.loaded(http.HandlerFunc(e.models)))
	mux.Handle("POST /v1/chat/completions", e.loaded(e.generate(true)))
	mux.Handle("POST /v1/completions", e.loaded(e.generate(false)))
	mux.Handle("POST /v1/embeddings", e.loaded(http.HandlerFunc(e.embeddings)))
	mux.Handle("POST /v1/audio/transcriptions", e.loaded(http.HandlerFunc(e.transcribe)))
	mux.Handle("POST /v1/audio/translations", e.loaded(http.HandlerFunc(e.transcribe)))
	mux.Handle("POST /v1/messages", e.loaded(http.HandlerFunc(e.messages)))
	mux.Handle("POST /v1/messages/count_tokens", e.loaded(http.HandlerFunc(e.countTokens)))
	e.flavorRoutes(mux)
	mux.HandleFunc("GET /debug/requests", e.debugRequests)
	mux.HandleFunc("GET /debug/stats", e.debugStats)
	if e.opts.SleepMode {
		control := map[string]http.HandlerFunc{
			"POST /sleep":                     e.sleep,
			"POST /wake_up":                   e.wakeUp,
			"GET /is_sleeping":                e.isSleeping,
			"POST /collective_rpc":            e.collectiveRPC,
			"POST /reset_prefix_cache":        e.resetPrefixCache,
			"POST /release_memory_occupation": e.releaseMemory,
			"POST /resume_memory_occupation":  e.resumeMemory,
		}
		for pattern, h := range control {
			mux.Handle(pattern, e.loaded(e.recorded(h)))
		}
	}
	return mux
}

// loaded answers 503 while the engine is still loading.
func (e *Engine) loaded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case e.loading() && e.opts.Flavor == FlavorLlamaCpp:
			llamacppLoading(w) // every route, as llama.cpp does
			return
		case e.loading():
			writeError(w, http.StatusServiceUnavailable, "the engine is loading")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// recorded logs a control request for /debug/requests. Control bodies are
// small JSON commands, never prompts, so keeping them is safe.
func (e *Engine) recorded(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxControlBody))
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("reading body: %v", err))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.recordControl(ControlRequest{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body)})
		h(w, r)
	}
}

// health is 503 while loading and 200 after (in the flavor's format);
// with HangHealth it never answers, holding the request until the client
// or server gives up, and with BusyHealth it does so while a completion
// runs. Ollama has no /health.
func (e *Engine) health(w http.ResponseWriter, r *http.Request) {
	if e.opts.Flavor == FlavorOllama {
		http.NotFound(w, r)
		return
	}
	if e.opts.HangHealth || e.opts.BusyHealth && e.Stats().Running > 0 {
		<-r.Context().Done()
		return
	}
	e.healthBody(w)
}

func (e *Engine) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		Root        string `json:"root"`
		MaxModelLen int    `json:"max_model_len"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	for _, m := range e.opts.Models {
		list.Data = append(list.Data, model{ID: m, Object: "model", Created: e.started.Unix(), OwnedBy: "napd-demo-engine", Root: m, MaxModelLen: maxModelLen})
	}
	writeJSON(w, http.StatusOK, list)
}

// metrics writes the vLLM gauges in Prometheus text format.
func (e *Engine) metrics(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	running, waiting, state, generated := e.running, e.waiting, e.sleepStateLocked(), e.generated
	e.mu.Unlock()
	labels := fmt.Sprintf(`engine="0",model_name=%q`, e.opts.Models[0])
	var b strings.Builder
	gauge := func(name, help string, value float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s{%s} %s\n", name, help, name, name, labels, strconv.FormatFloat(value, 'g', -1, 64))
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", float64(running))
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(waiting))
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", float64(running)/float64(e.opts.MaxNumSeqs))
	fmt.Fprintf(&b, "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{%s} %d\n", labels, generated)
	b.WriteString("# HELP vllm:engine_sleep_state Engine sleep state; 1 for the current state.\n# TYPE vllm:engine_sleep_state gauge\n")
	for _, s := range []string{"awake", "weights_offloaded", "discard_all"} {
		v := 0
		if s == state {
			v = 1
		}
		fmt.Fprintf(&b, "vllm:engine_sleep_state{%s,sleep_state=%q} %d\n", labels, s, v)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(w, b.String())
}

func (e *Engine) debugRequests(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.ControlRequests())
}

func (e *Engine) debugStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.Stats())
}

// sleep is vLLM's POST /sleep?level=1|2&mode=abort|wait. Level and mode
// are query parameters; a JSON body is ignored, as vLLM ignores it.
func (e *Engine) sleep(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	level := 1
	if s := q.Get("level"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 2 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("sleep level must be 1 or 2, got %q", s))
			return
		}
		level = n
	}
	mode := q.Get("mode")
	if mode == "" {
		mode = "abort"
	}
	if mode != "abort" && mode != "wait" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sleep mode must be abort or wait, got %q", mode))
		return
	}
	switch err := e.Sleep(r.Context(), level, mode == "abort"); {
	case errors.Is(err, errSleeping):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	}
}

// wakeUp is vLLM's POST /wake_up[?tags=weights&tags=kv_cache].
func (e *Engine) wakeUp(w http.ResponseWriter, r *http.Request) {
	if err := e.WakeUp(r.Context(), r.URL.Query()["tags"]); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
	}
}

func (e *Engine) isSleeping(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": e.Stats().IsSleeping})
}

// collectiveRPC is vLLM's POST /collective_rpc; only reload_weights, the
// step of the level-2 wake, is emulated.
func (e *Engine) collectiveRPC(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Method string `json:"method"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return
	}
	switch body.Method {
	case "":
		writeError(w, http.StatusBadRequest, "Missing 'method' in request body")
	case "reload_weights":
		if err := e.ReloadWeights(); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string][]any{"results": {nil}})
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("collective_rpc method %q is not emulated", body.Method))
	}
}

// resetPrefixCache is vLLM's POST /reset_prefix_cache; the emulator keeps
// no cache, so it only acknowledges (and /debug/requests shows the call).
func (e *Engine) resetPrefixCache(http.ResponseWriter, *http.Request) {}

// memoryTags reads SGLang's optional {"tags": [...]} body.
func memoryTags(r *http.Request) ([]string, error) {
	var body struct {
		Tags []string `json:"tags"`
	}
	err := json.NewDecoder(r.Body).Decode(&body)
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("invalid JSON body: %w", err)
	}
	return body.Tags, nil
}

// releaseMemory is SGLang's POST /release_memory_occupation.
func (e *Engine) releaseMemory(w http.ResponseWriter, r *http.Request) {
	tags, err := memoryTags(r)
	if err == nil {
		err = e.Release(tags)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
	}
}

// resumeMemory is SGLang's POST /resume_memory_occupation.
func (e *Engine) resumeMemory(w http.ResponseWriter, r *http.Request) {
	tags, err := memoryTags(r)
	if err == nil {
		err = e.Resume(r.Context(), tags)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
	}
}

// writeJSON answers with a JSON document and its length, so that a client
// gets the whole answer even if the process exits right after.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	w.Write(b)
}

// apiError is OpenAI's (and vLLM's) error body.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

var errorTypes = map[int]string{
	http.StatusBadRequest:            "BadRequestError",
	http.StatusNotFound:              "NotFoundError",
	http.StatusConflict:              "ConflictError",
	http.StatusRequestEntityTooLarge: "BadRequestError",
	http.StatusInternalServerError:   "InternalServerError",
	http.StatusServiceUnavailable:    "ServiceUnavailableError",
}

func newAPIError(code int, msg string) apiError {
	var body apiError
	body.Error.Message, body.Error.Type, body.Error.Code = msg, errorTypes[code], code
	return body
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, newAPIError(code, msg))
}

// served reports whether model names a served model.
func (e *Engine) served(model string) bool {
	return slices.Contains(e.opts.Models, model)
}

// interval is the pause between tokens after the first.
func (e *Engine) interval() time.Duration {
	if e.opts.TokensPerSecond <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / e.opts.TokensPerSecond)
}
