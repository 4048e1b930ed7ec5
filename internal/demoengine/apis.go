package demoengine

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
)

// The embedding, audio and Anthropic Messages endpoints: what vLLM serves
// for those tasks, in the shapes the official SDKs read. Each is admitted
// as a job like a completion, so concurrency, sleep and loading hold.

// embeddingDims is the length of every emulated embedding.
const embeddingDims = 8

// run answers 404 for a model the engine does not serve, admits the request
// as a job (answering the engine's refusals) and runs fn with it.
func (e *Engine) run(w http.ResponseWriter, r *http.Request, model string, fn func(*job)) {
	if !e.served(model) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model))
		return
	}
	j, err := e.admit(r.Context())
	switch {
	case errors.Is(err, errAsleep), errors.Is(err, errAborted):
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	case errors.Is(err, errStale):
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	case err != nil:
		return // the client left while waiting for a slot
	}
	defer e.finish(j)
	fn(j)
}

// decodeJSON reads a JSON request body into v, answering 400 or 413.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(v)
	if err == nil {
		return true
	}
	code := http.StatusBadRequest
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		code = http.StatusRequestEntityTooLarge
	}
	writeError(w, code, fmt.Sprintf("invalid JSON body: %v", err))
	return false
}

// embeddings is /v1/embeddings: one deterministic vector per input, as
// floats or, with encoding_format "base64" (what the OpenAI SDKs ask for),
// as little-endian float32 bytes in base64.
func (e *Engine) embeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	inputs, err := embeddingInputs(req.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "input: "+err.Error())
		return
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("encoding_format must be float or base64, got %q", req.EncodingFormat))
		return
	}
	e.run(w, r, req.Model, func(*job) {
		data := make([]map[string]any, len(inputs))
		tokens := 0
		for i, in := range inputs {
			tokens += len(strings.Fields(in))
			vec := embed(in)
			var v any = vec
			if req.EncodingFormat == "base64" {
				b := make([]byte, 4*len(vec))
				for k, f := range vec {
					binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(f))
				}
				v = base64.StdEncoding.EncodeToString(b)
			}
			data[i] = map[string]any{"object": "embedding", "index": i, "embedding": v}
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"object": "list", "data": data, "model": req.Model,
			"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens},
		})
		e.completed()
	})
}

// embeddingInputs reads input: a string, an array of strings, or token
// ids (each array of ids is one input, its ids joined as words).
func embeddingInputs(raw json.RawMessage) ([]string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		return ss, nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		return []string{fmt.Sprint(ids)}, nil
	}
	var batches [][]int
	if json.Unmarshal(raw, &batches) == nil && len(batches) > 0 {
		out := make([]string, len(batches))
		for i, b := range batches {
			out[i] = fmt.Sprint(b)
		}
		return out, nil
	}
	return nil, errors.New("want a string, an array of strings or an array of token ids")
}

// embed is a unit vector derived from the text's SHA-256: equal texts get
// equal vectors.
func embed(text string) []float32 {
	sum := sha256.Sum256([]byte(text))
	vec := make([]float32, embeddingDims)
	var norm float64
	for i := range vec {
		v := float64(int8(sum[i])) + 0.5
		vec[i] = float32(v)
		norm += v * v
	}
	for i := range vec {
		vec[i] = float32(float64(vec[i]) / math.Sqrt(norm))
	}
	return vec
}

// transcribe is /v1/audio/transcriptions and /v1/audio/translations: a
// multipart form with `file` and `model`. The "transcript" names the file,
// its size and the start of its SHA-256, so a client can check the upload
// arrived whole.
func (e *Engine) transcribe(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseMultipartForm(1 << 20); err != nil {
		code := http.StatusBadRequest
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			code = http.StatusRequestEntityTooLarge
		}
		writeError(w, code, fmt.Sprintf("invalid multipart form: %v", err))
		return
	}
	defer r.MultipartForm.RemoveAll()
	model := r.FormValue("model")
	file, hdr, err := r.FormFile("file")
	if err != nil {
		writeError(w, http.StatusBadRequest, "file: "+err.Error())
		return
	}
	defer file.Close()
	format := r.FormValue("response_format")
	switch format {
	case "", "json", "text", "verbose_json":
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("response_format %q is not emulated (json, text or verbose_json)", format))
		return
	}
	h := sha256.New()
	size, err := io.Copy(h, file)
	if err != nil {
		writeError(w, http.StatusBadRequest, "file: "+err.Error())
		return
	}
	e.run(w, r, model, func(*job) {
		text := fmt.Sprintf("%s: %d bytes, sha256 %x", hdr.Filename, size, h.Sum(nil)[:8])
		switch format {
		case "text":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, text+"\n")
		case "verbose_json":
			writeJSON(w, http.StatusOK, map[string]any{"task": "transcribe", "language": "en", "duration": 0, "text": text, "segments": []any{}})
		default:
			writeJSON(w, http.StatusOK, map[string]string{"text": text})
		}
		e.completed()
	})
}

// messagesRequest is the part of an Anthropic Messages request the
// emulator reads.
type messagesRequest struct {
	Model     string `json:"model"`
	MaxTokens *int   `json:"max_tokens"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	System json.RawMessage `json:"system"`
	Stream bool            `json:"stream"`
}

// inputTokens counts the words of the system prompt and every message.
func (m messagesRequest) inputTokens() (int, error) {
	n, err := contentTokens(m.System)
	if err != nil {
		return 0, fmt.Errorf("system: %w", err)
	}
	if len(m.Messages) == 0 {
		return 0, errors.New("messages: at least one message is required")
	}
	for i, msg := range m.Messages {
		k, err := contentTokens(msg.Content)
		if err != nil {
			return 0, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		n += k
	}
	return n, nil
}

// countTokens is Anthropic's /v1/messages/count_tokens.
func (e *Engine) countTokens(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	n, err := req.inputTokens()
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	e.run(w, r, req.Model, func(*job) {
		writeJSON(w, http.StatusOK, map[string]int{"input_tokens": n})
	})
}

// messages is Anthropic's /v1/messages (as vLLM serves it): the same
// deterministic tokens as a chat completion, answered as a message or
// streamed as Anthropic's events.
func (e *Engine) messages(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	n, err := req.inputTokens()
	if err == nil && (req.MaxTokens == nil || *req.MaxTokens < 1 || *req.MaxTokens > maxModelLen) {
		err = fmt.Errorf("max_tokens is required, between 1 and %d", maxModelLen)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	g := generation{chat: true, model: req.Model, promptTokens: n, maxTokens: *req.MaxTokens, seed: n, stream: req.Stream}
	e.run(w, r, req.Model, func(j *job) {
		id := fmt.Sprintf("msg_demo%d", e.nextID())
		if g.stream {
			e.streamMessage(w, j, g, id)
			return
		}
		if !e.generateAll(w, j, g) {
			return
		}
		writeJSON(w, http.StatusOK, message(id, g, g.text(), "max_tokens", g.maxTokens))
		e.completed()
	})
}

// message is an Anthropic message object.
func message(id string, g generation, text string, stop any, outputTokens int) map[string]any {
	content := []any{}
	if text != "" {
		content = append(content, map[string]string{"type": "text", "text": text})
	}
	return map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": g.model,
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]int{"input_tokens": g.promptTokens, "output_tokens": outputTokens},
	}
}

// streamMessage sends Anthropic's event sequence: message_start,
// content_block_start, ping, one content_block_delta per token,
// content_block_stop, message_delta, message_stop.
func (e *Engine) streamMessage(w http.ResponseWriter, j *job, g generation, id string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(event string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return err
		}
		return rc.Flush()
	}
	err := send("message_start", map[string]any{"type": "message_start", "message": message(id, g, "", nil, 0)})
	if err == nil {
		err = send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}})
	}
	if err == nil {
		err = send("ping", map[string]string{"type": "ping"})
	}
	for i := 0; err == nil && i < g.maxTokens; i++ {
		if err = e.tokenDelay(j, i); errors.Is(err, errAborted) {
			e.interrupted(g, err)
			send("error", map[string]any{"type": "error", "error": map[string]string{"type": "overloaded_error", "message": err.Error()}})
			return
		}
		if err == nil {
			err = send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": g.token(i)}})
		}
	}
	if err == nil {
		err = send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	}
	if err == nil {
		err = send("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": "max_tokens", "stop_sequence": nil}, "usage": map[string]int{"output_tokens": g.maxTokens}})
	}
	if err == nil {
		err = send("message_stop", map[string]string{"type": "message_stop"})
	}
	if err != nil {
		e.interrupted(g, err)
		return
	}
	e.completed()
}
