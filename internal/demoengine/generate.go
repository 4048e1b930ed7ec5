package demoengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// crashChunks is how many tokens a stream sends before a CrashAfter crash.
const crashChunks = 3

// generate serves /v1/chat/completions (chat) or /v1/completions.
func (e *Engine) generate(chat bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g, err := parseRequest(http.MaxBytesReader(w, r.Body, maxBody), chat)
		if err != nil {
			code := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				code = http.StatusRequestEntityTooLarge
			}
			writeError(w, code, err.Error())
			return
		}
		if g.model == "" {
			g.model = e.opts.Models[0]
		}
		if !e.tookPriority(g.priority) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("Got priority %d but Priority scheduling is not enabled.", *g.priority))
			return
		}
		e.run(w, r, g.model, func(j *job) {
			if g.stream {
				e.stream(w, j, g)
			} else {
				e.complete(w, j, g)
			}
		})
	})
}

// tookPriority counts a completion's priority field in Stats.Priorities
// ("none" when absent), or reports false for a non-zero one without
// PriorityScheduling.
func (e *Engine) tookPriority(p *int) bool {
	key := "none"
	if p != nil {
		if *p != 0 && !e.opts.PriorityScheduling {
			return false
		}
		key = fmt.Sprint(*p)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stats.Priorities == nil {
		e.stats.Priorities = map[string]int{}
	}
	e.stats.Priorities[key]++
	return true
}

// tokenDelay waits until token i of j is due: TTFT before the first, the
// tokens-per-second interval before each other. A token that is due counts
// in the generation counters.
func (e *Engine) tokenDelay(j *job, i int) error {
	d := e.interval()
	if i == 0 {
		d = e.opts.TTFT
	}
	if err := e.delay(j.ctx, d); err != nil {
		return err
	}
	e.mu.Lock()
	e.generated++
	j.decoded++
	e.mu.Unlock()
	return nil
}

// crashes reports whether this job is the CrashAfter-th completion.
func (e *Engine) crashes(j *job) bool {
	return e.opts.CrashAfter > 0 && j.ordinal == e.opts.CrashAfter
}

// interrupted accounts for a completion stopped by err: a sleep's abort
// or the client leaving.
func (e *Engine) interrupted(g generation, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case errors.Is(err, errAborted):
		e.stats.Aborted++
	case g.stream:
		e.stats.StreamsCancelled++
	default:
		e.stats.RequestsCancelled++
	}
}

func (e *Engine) completed() {
	e.mu.Lock()
	e.stats.Completions++
	e.mu.Unlock()
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (g generation) usage() usage {
	return usage{PromptTokens: g.promptTokens, CompletionTokens: g.maxTokens, TotalTokens: g.promptTokens + g.maxTokens}
}

// envelope is the common part of completion responses and chunks.
type envelope struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []any  `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

func (e *Engine) envelope(g generation, object string) envelope {
	prefix := "cmpl-"
	if g.chat {
		prefix = "chatcmpl-"
	}
	return envelope{ID: fmt.Sprintf("%s%d", prefix, e.nextID()), Object: object, Created: time.Now().Unix(), Model: g.model, Choices: []any{}}
}

// choice is one choice of a response (delta false) or chunk (delta true);
// finish is nil until the last token.
func (g generation) choice(text string, finish any, delta bool) any {
	if !g.chat {
		return map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": finish}
	}
	if delta {
		return map[string]any{"index": 0, "delta": map[string]string{"content": text}, "logprobs": nil, "finish_reason": finish}
	}
	return map[string]any{"index": 0, "message": map[string]string{"role": "assistant", "content": text}, "logprobs": nil, "finish_reason": finish}
}

// generateAll waits until every token of a non-streamed generation is
// due. Interrupted, it counts the interruption, answers 503 for a sleep's
// abort (nothing to a client that left) and returns false.
func (e *Engine) generateAll(w http.ResponseWriter, j *job, g generation) bool {
	for i := range g.maxTokens {
		if err := e.tokenDelay(j, i); err != nil {
			e.interrupted(g, err)
			if errors.Is(err, errAborted) {
				writeError(w, http.StatusServiceUnavailable, err.Error())
			}
			return false
		}
	}
	return true
}

// complete answers a non-streamed completion after the whole generation
// time has passed.
func (e *Engine) complete(w http.ResponseWriter, j *job, g generation) {
	if !e.generateAll(w, j, g) {
		return
	}
	object := "text_completion"
	if g.chat {
		object = "chat.completion"
	}
	resp := e.envelope(g, object)
	resp.Choices = []any{g.choice(g.text(), "length", false)}
	u := g.usage()
	resp.Usage = &u
	writeJSON(w, http.StatusOK, resp)
	e.completed()
	if e.crashes(j) {
		// The answer must reach the client before the process dies.
		http.NewResponseController(w).Flush()
		e.log.Warn("crashing as configured", "completions", j.ordinal)
		e.exit(CrashExitCode)
	}
}

// stream answers with server-sent events in OpenAI's chunk shape, one chunk
// per token, flushed as it is produced, then "data: [DONE]".
func (e *Engine) stream(w http.ResponseWriter, j *job, g generation) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
	}
	// Every chunk of one completion carries the same id.
	base := e.envelope(g, object)
	chunk := func(choice any) envelope {
		c := base
		c.Choices = []any{choice}
		return c
	}
	if g.chat {
		first := map[string]any{"index": 0, "delta": map[string]string{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}
		if err := send(chunk(first)); err != nil {
			e.interrupted(g, context.Canceled)
			return
		}
	}
	crashAt := -1
	if e.crashes(j) {
		crashAt = min(crashChunks, g.maxTokens-1)
	}
	for i := range g.maxTokens {
		if i == crashAt {
			e.log.Warn("crashing mid-stream as configured", "completions", j.ordinal, "chunks", i)
			e.exit(CrashExitCode)
			return
		}
		err := e.tokenDelay(j, i)
		if errors.Is(err, errAborted) {
			e.interrupted(g, err)
			// vLLM reports a failure inside a stream as an error event.
			if send(newAPIError(http.StatusServiceUnavailable, err.Error())) == nil {
				io.WriteString(w, "data: [DONE]\n\n")
				rc.Flush()
			}
			return
		}
		var finish any
		if i == g.maxTokens-1 {
			finish = "length"
		}
		if err == nil {
			err = send(chunk(g.choice(g.token(i), finish, true)))
		}
		if err != nil {
			e.interrupted(g, err)
			return
		}
	}
	if g.includeUsage {
		c, u := base, g.usage()
		c.Usage = &u
		if err := send(c); err != nil {
			e.interrupted(g, err)
			return
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil || rc.Flush() != nil {
		e.interrupted(g, context.Canceled)
		return
	}
	e.completed()
}
