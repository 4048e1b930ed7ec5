package demoengine

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newEngine builds an engine with a silent logger and instant tokens
// unless opts says otherwise.
func newEngine(opts Options) *Engine {
	opts.Logger = quiet()
	return New(opts)
}

// call serves one request in the calling goroutine.
func call(ctx context.Context, h http.Handler, method, target, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func do(h http.Handler, method, target, body string) *httptest.ResponseRecorder {
	return call(context.Background(), h, method, target, body)
}

// async serves a request in its own goroutine; the channel yields its
// recorder when the handler returns.
func async(ctx context.Context, h http.Handler, method, target, body string) <-chan *httptest.ResponseRecorder {
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- call(ctx, h, method, target, body) }()
	return done
}

func wantCode(t *testing.T, rec *httptest.ResponseRecorder, code int) {
	t.Helper()
	if rec.Code != code {
		t.Fatalf("status %d, want %d; body %s", rec.Code, code, rec.Body)
	}
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decoding %q: %v", rec.Body, err)
	}
	return v
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, line)
		}
	}
	return events
}

type chatChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage    `json:"usage"`
	Error *struct{} `json:"error"`
}

func metricValues(t *testing.T, h http.Handler) map[string]float64 {
	t.Helper()
	rec := do(h, "GET", "/metrics", "")
	wantCode(t, rec, http.StatusOK)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parsing metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() == "sleep_state" {
					key += "/" + l.GetValue()
				}
				if l.GetName() == "model_name" && l.GetValue() != "demo" {
					t.Errorf("%s: model_name %q, want demo", name, l.GetValue())
				}
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

func TestEngine_LoadingThenHealthy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newEngine(Options{StartupDelay: 2 * time.Second}).Handler()
		wantCode(t, do(h, "GET", "/health", ""), http.StatusServiceUnavailable)
		wantCode(t, do(h, "GET", "/v1/models", ""), http.StatusServiceUnavailable)
		wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x"}`), http.StatusServiceUnavailable)
		wantCode(t, do(h, "GET", "/debug/stats", ""), http.StatusOK)
		time.Sleep(1999 * time.Millisecond)
		wantCode(t, do(h, "GET", "/health", ""), http.StatusServiceUnavailable)
		time.Sleep(time.Millisecond)
		wantCode(t, do(h, "GET", "/health", ""), http.StatusOK)
		wantCode(t, do(h, "GET", "/v1/models", ""), http.StatusOK)
	})
}

func TestEngine_HangHealthNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newEngine(Options{HangHealth: true}).Handler()
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		start := time.Now()
		rec := call(ctx, h, "GET", "/health", "")
		if waited := time.Since(start); waited != time.Hour {
			t.Fatalf("health returned after %v, want it to hold until the client gave up (1h)", waited)
		}
		if rec.Body.Len() != 0 || len(rec.Header()) != 0 {
			t.Fatalf("hanging health wrote %q", rec.Body)
		}
		wantCode(t, do(h, "GET", "/v1/models", ""), http.StatusOK)
	})
}

func TestEngine_Models(t *testing.T) {
	type list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	l := decode[list](t, do(newEngine(Options{}).Handler(), "GET", "/v1/models", ""))
	if l.Object != "list" || len(l.Data) != 1 || l.Data[0].ID != "demo" || l.Data[0].Object != "model" {
		t.Fatalf("default models = %+v, want one model demo", l)
	}
	l = decode[list](t, do(newEngine(Options{Models: []string{"a", "b"}}).Handler(), "GET", "/v1/models", ""))
	if len(l.Data) != 2 || l.Data[0].ID != "a" || l.Data[1].ID != "b" {
		t.Fatalf("models = %+v, want a and b", l)
	}
}

func TestEngine_ChatCompletion(t *testing.T) {
	h := newEngine(Options{}).Handler()
	rec := do(h, "POST", "/v1/chat/completions", `{"model":"demo","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello world"}]}],"max_tokens":3}`)
	wantCode(t, rec, http.StatusOK)
	resp := decode[struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}](t, rec)
	if resp.Object != "chat.completion" || resp.Model != "demo" || !strings.HasPrefix(resp.ID, "chatcmpl-") {
		t.Errorf("envelope = %+v", resp)
	}
	// 4 prompt words, so the text starts at tok4.
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != "tok4 tok5 tok6" || resp.Choices[0].Message.Role != "assistant" || resp.Choices[0].FinishReason != "length" {
		t.Errorf("choices = %+v", resp.Choices)
	}
	if resp.Usage != (usage{PromptTokens: 4, CompletionTokens: 3, TotalTokens: 7}) {
		t.Errorf("usage = %+v", resp.Usage)
	}
	if got := decode[Stats](t, do(h, "GET", "/debug/stats", "")).Completions; got != 1 {
		t.Errorf("completions = %d, want 1", got)
	}
}

func TestEngine_CompletionDefaultsAndSeed(t *testing.T) {
	h := newEngine(Options{}).Handler()
	type resp struct {
		Object  string `json:"object"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	r := decode[resp](t, do(h, "POST", "/v1/completions", `{"prompt":["a b","c"]}`))
	if r.Object != "text_completion" || r.Usage.CompletionTokens != defaultMaxTokens || r.Usage.PromptTokens != 3 {
		t.Fatalf("response = %+v, want %d completion tokens and 3 prompt tokens", r, defaultMaxTokens)
	}
	if words := strings.Fields(r.Choices[0].Text); len(words) != defaultMaxTokens || words[0] != "tok3" {
		t.Fatalf("text = %q", r.Choices[0].Text)
	}
	r = decode[resp](t, do(h, "POST", "/v1/completions", `{"model":"demo","prompt":[1,2,3,4,5],"max_tokens":2,"seed":40}`))
	if r.Choices[0].Text != "tok40 tok41" || r.Usage.PromptTokens != 5 {
		t.Fatalf("seeded response = %+v", r)
	}
}

func TestEngine_RequestErrors(t *testing.T) {
	h := newEngine(Options{}).Handler()
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
	}{
		{"bad JSON", "POST", "/v1/chat/completions", `{"model":`, 400},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"demo"}`, 400},
		{"bad content", "POST", "/v1/chat/completions", `{"messages":[{"content":5}]}`, 400},
		{"no prompt", "POST", "/v1/completions", `{"model":"demo"}`, 400},
		{"bad prompt", "POST", "/v1/completions", `{"prompt":{"a":1}}`, 400},
		{"zero max_tokens", "POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400},
		{"huge max_tokens", "POST", "/v1/completions", `{"prompt":"x","max_tokens":100000}`, 400},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"content":"x"}]}`, 404},
		{"wrong method", "GET", "/v1/completions", ``, 405},
		{"sleep mode off", "POST", "/sleep?level=1", ``, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := do(h, tc.method, tc.path, tc.body)
			wantCode(t, rec, tc.code)
			if tc.code == 405 || tc.path == "/sleep?level=1" {
				return
			}
			e := decode[apiError](t, rec)
			if e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("error body = %+v, want OpenAI error shape with code %d", e, tc.code)
			}
		})
	}
}

func TestEngine_StreamChat(t *testing.T) {
	h := newEngine(Options{}).Handler()
	rec := do(h, "POST", "/v1/chat/completions", `{"messages":[{"content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`)
	wantCode(t, rec, http.StatusOK)
	if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	events := sseEvents(t, rec.Body.String())
	// role chunk, 3 tokens, usage, [DONE]
	if len(events) != 6 || events[5] != "[DONE]" {
		t.Fatalf("events = %q", events)
	}
	var text strings.Builder
	var id string
	for i, ev := range events[:5] {
		var c chatChunk
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("chunk %d %q: %v", i, ev, err)
		}
		if c.Object != "chat.completion.chunk" || c.Model != "demo" {
			t.Errorf("chunk %d envelope = %+v", i, c)
		}
		if id == "" {
			id = c.ID
		} else if c.ID != id {
			t.Errorf("chunk %d id %q, want %q like the first", i, c.ID, id)
		}
		switch {
		case i == 0:
			if c.Choices[0].Delta.Role != "assistant" {
				t.Errorf("first chunk = %s, want the role", ev)
			}
		case i == 4:
			if len(c.Choices) != 0 || c.Usage == nil || *c.Usage != (usage{1, 3, 4}) {
				t.Errorf("usage chunk = %s", ev)
			}
		default:
			text.WriteString(c.Choices[0].Delta.Content)
			if last := i == 3; last != (c.Choices[0].FinishReason != nil) {
				t.Errorf("chunk %d finish_reason = %v", i, c.Choices[0].FinishReason)
			}
		}
	}
	if text.String() != "tok1 tok2 tok3" {
		t.Fatalf("streamed text %q", text.String())
	}
}

func TestEngine_TokenTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newEngine(Options{TTFT: time.Second, TokensPerSecond: 10}).Handler()
		for _, stream := range []string{"false", "true"} {
			start := time.Now()
			rec := do(h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":5,"stream":`+stream+`}`)
			wantCode(t, rec, http.StatusOK)
			if took, want := time.Since(start), 1400*time.Millisecond; took != want {
				t.Errorf("stream=%s took %v, want TTFT 1s + 4 tokens at 10/s = %v", stream, took, want)
			}
		}
	})
}

func TestEngine_ClientDisconnectStopsStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{TokensPerSecond: 1})
		ctx, cancel := context.WithCancel(t.Context())
		done := async(ctx, e.Handler(), "POST", "/v1/chat/completions", `{"messages":[{"content":"x"}],"max_tokens":100,"stream":true}`)
		time.Sleep(3500 * time.Millisecond)
		if s := e.Stats(); s.Running != 1 {
			t.Fatalf("running = %d during the stream", s.Running)
		}
		cancel()
		synctest.Wait()
		start := time.Now()
		rec := <-done
		if time.Since(start) != 0 {
			t.Fatal("generation went on after the client left")
		}
		events := sseEvents(t, rec.Body.String())
		// role + tokens at 0s, 1s, 2s, 3s; nothing after the disconnect.
		if len(events) != 5 || strings.Contains(rec.Body.String(), "[DONE]") {
			t.Fatalf("events after disconnect = %q", events)
		}
		s := e.Stats()
		if s.StreamsCancelled != 1 || s.Completions != 0 || s.Running != 0 {
			t.Fatalf("stats = %+v, want one cancelled stream, none running", s)
		}
	})
}

func TestEngine_SleepLevel1(t *testing.T) {
	e := newEngine(Options{SleepMode: true, MemoryBytes: 1 << 20})
	h := e.Handler()
	wantCode(t, do(h, "POST", "/sleep?level=1", ""), http.StatusOK)
	if got := decode[map[string]bool](t, do(h, "GET", "/is_sleeping", "")); !got["is_sleeping"] {
		t.Fatalf("is_sleeping = %v after sleep", got)
	}
	m := metricValues(t, h)
	if m["vllm:engine_sleep_state/weights_offloaded"] != 1 || m["vllm:engine_sleep_state/awake"] != 0 || m["vllm:engine_sleep_state/discard_all"] != 0 {
		t.Fatalf("sleep state metrics = %v", m)
	}
	// As in vLLM, /health says the engine lives, not whether it sleeps.
	wantCode(t, do(h, "GET", "/health", ""), http.StatusOK)
	rec := do(h, "POST", "/v1/completions", `{"prompt":"x"}`)
	wantCode(t, rec, http.StatusServiceUnavailable)
	if e := decode[apiError](t, rec); e.Error.Code != 503 {
		t.Fatalf("asleep error = %+v", e)
	}
	if s := e.Stats(); s.WeightsBytes != 1<<20 || s.Rejected != 1 {
		t.Fatalf("stats = %+v, want weights kept and one rejection", s)
	}
	// Sleeping again is a no-op, as in vLLM.
	wantCode(t, do(h, "POST", "/sleep?level=2", ""), http.StatusOK)
	if s := e.Stats(); s.SleepState != "weights_offloaded" {
		t.Fatalf("a second sleep changed the state to %q", s.SleepState)
	}
	wantCode(t, do(h, "POST", "/wake_up", ""), http.StatusOK)
	if got := decode[map[string]bool](t, do(h, "GET", "/is_sleeping", "")); got["is_sleeping"] {
		t.Fatal("still sleeping after wake_up")
	}
	if m := metricValues(t, h); m["vllm:engine_sleep_state/awake"] != 1 {
		t.Fatalf("sleep state metrics after wake = %v", m)
	}
	wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x"}`), http.StatusOK)
}

// A popular wrapper sends the level as JSON; vLLM ignores the body and
// sleeps at level 1, and so must the emulator, so that napd's tests catch it.
func TestEngine_SleepLevelIsAQueryParameter(t *testing.T) {
	e := newEngine(Options{SleepMode: true, MemoryBytes: 1 << 20})
	wantCode(t, do(e.Handler(), "POST", "/sleep", `{"level":2}`), http.StatusOK)
	if s := e.Stats(); s.SleepState != "weights_offloaded" || s.WeightsBytes != 1<<20 {
		t.Fatalf("stats = %+v, want a level-1 sleep", s)
	}
}

func TestEngine_SleepLevel2WakeSequence(t *testing.T) {
	e := newEngine(Options{SleepMode: true, MemoryBytes: 1 << 20})
	h := e.Handler()
	wantCode(t, do(h, "POST", "/sleep?level=2", ""), http.StatusOK)
	if s := e.Stats(); s.SleepState != "discard_all" || s.WeightsBytes != 0 {
		t.Fatalf("after level-2 sleep: %+v", s)
	}
	wantCode(t, do(h, "POST", "/collective_rpc", `{"method":"reload_weights"}`), http.StatusInternalServerError)
	wantCode(t, do(h, "POST", "/wake_up?tags=weights", ""), http.StatusOK)
	if s := e.Stats(); !s.IsSleeping || s.WeightsBytes != 1<<20 || s.WeightsLoaded {
		t.Fatalf("after waking weights: %+v, want still sleeping, memory back, not loaded", s)
	}
	wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x"}`), http.StatusServiceUnavailable)
	// Waking the weights twice is a no-op: the tag is no longer asleep.
	wantCode(t, do(h, "POST", "/wake_up?tags=weights", ""), http.StatusOK)
	rec := do(h, "POST", "/collective_rpc", `{"method":"reload_weights"}`)
	wantCode(t, rec, http.StatusOK)
	if got := rec.Body.String(); got != `{"results":[null]}` {
		t.Fatalf("collective_rpc answered %s", got)
	}
	wantCode(t, do(h, "POST", "/wake_up?tags=kv_cache", ""), http.StatusOK)
	wantCode(t, do(h, "POST", "/reset_prefix_cache", ""), http.StatusOK)
	if s := e.Stats(); s.IsSleeping || s.SleepState != "awake" || !s.WeightsLoaded {
		t.Fatalf("after the wake sequence: %+v", s)
	}
	wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x"}`), http.StatusOK)
}

func TestEngine_Level2WakeWithoutReloadCannotServe(t *testing.T) {
	e := newEngine(Options{SleepMode: true})
	h := e.Handler()
	wantCode(t, do(h, "POST", "/sleep?level=2", ""), http.StatusOK)
	wantCode(t, do(h, "POST", "/wake_up", ""), http.StatusOK)
	if s := e.Stats(); s.IsSleeping || s.WeightsLoaded {
		t.Fatalf("stats = %+v, want awake with unloaded weights", s)
	}
	wantCode(t, do(h, "POST", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`), http.StatusInternalServerError)
}

func TestEngine_ControlErrors(t *testing.T) {
	h := newEngine(Options{SleepMode: true}).Handler()
	for _, tc := range []struct {
		path, body string
		code       int
	}{
		{"/sleep?level=3", "", 400},
		{"/sleep?level=one", "", 400},
		{"/sleep?mode=keep", "", 400},
		{"/collective_rpc", `{`, 400},
		{"/collective_rpc", `{}`, 400},
		{"/collective_rpc", `{"method":"save_sharded_state"}`, 400},
		{"/release_memory_occupation", `{"tags":["gpu"]}`, 400},
		{"/resume_memory_occupation", ``, 400},
	} {
		wantCode(t, do(h, "POST", tc.path, tc.body), tc.code)
	}
	if s := decode[Stats](t, do(h, "GET", "/debug/stats", "")); s.IsSleeping {
		t.Fatal("a refused control request put the engine to sleep")
	}
}

func TestEngine_WakeUnknownTagIsANoop(t *testing.T) {
	e := newEngine(Options{SleepMode: true})
	h := e.Handler()
	wantCode(t, do(h, "POST", "/wake_up", ""), http.StatusOK) // awake: no-op
	wantCode(t, do(h, "POST", "/sleep", ""), http.StatusOK)
	wantCode(t, do(h, "POST", "/wake_up?tags=bogus&tags=weights", ""), http.StatusOK)
	if s := e.Stats(); !s.IsSleeping || s.SleepState != "weights_offloaded" {
		t.Fatalf("stats = %+v, want the wake with an unknown tag ignored", s)
	}
}

func TestEngine_WakeDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{SleepMode: true, WakeDelay: 3 * time.Second})
		h := e.Handler()
		wantCode(t, do(h, "POST", "/sleep", ""), http.StatusOK)
		start := time.Now()
		done := async(t.Context(), h, "POST", "/wake_up", "")
		time.Sleep(2 * time.Second)
		if !e.Stats().IsSleeping {
			t.Fatal("awake before the wake delay passed")
		}
		wantCode(t, <-done, http.StatusOK)
		if took := time.Since(start); took != 3*time.Second {
			t.Fatalf("wake took %v, want the 3s wake delay", took)
		}
		if e.Stats().IsSleeping {
			t.Fatal("still sleeping after the wake")
		}
	})
}

func TestEngine_SleepAbortsRunningStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{SleepMode: true, TokensPerSecond: 1})
		h := e.Handler()
		stream := async(t.Context(), h, "POST", "/v1/chat/completions", `{"messages":[{"content":"x"}],"max_tokens":10,"stream":true}`)
		time.Sleep(1500 * time.Millisecond)
		wantCode(t, do(h, "POST", "/sleep?level=1&mode=abort", ""), http.StatusOK)
		rec := <-stream
		events := sseEvents(t, rec.Body.String())
		// role, tok at 0s and 1s, the error event, [DONE]
		if len(events) != 5 || events[4] != "[DONE]" || !strings.Contains(events[3], `"error"`) {
			t.Fatalf("aborted stream events = %q", events)
		}
		if s := e.Stats(); s.Aborted != 1 || !s.IsSleeping || s.Running != 0 {
			t.Fatalf("stats = %+v", s)
		}
	})
}

func TestEngine_SleepWaitDrainsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{SleepMode: true, TTFT: 5 * time.Second})
		h := e.Handler()
		start := time.Now()
		running := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		time.Sleep(time.Second)
		sleep := async(t.Context(), h, "POST", "/sleep?level=1&mode=wait", "")
		synctest.Wait()
		// While draining: no new work, and no second sleep.
		wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x"}`), http.StatusServiceUnavailable)
		wantCode(t, do(h, "POST", "/sleep", ""), http.StatusConflict)
		wantCode(t, <-running, http.StatusOK)
		wantCode(t, <-sleep, http.StatusOK)
		if took := time.Since(start); took != 5*time.Second {
			t.Fatalf("sleep returned at %v, want when the running request finished (5s)", took)
		}
		if s := e.Stats(); !s.IsSleeping || s.Completions != 1 || s.Aborted != 0 {
			t.Fatalf("stats = %+v", s)
		}
	})
}

func TestEngine_SleepWaitGivenUpReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{SleepMode: true, TTFT: time.Hour})
		h := e.Handler()
		_ = async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x"}`)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		wantCode(t, call(ctx, h, "POST", "/sleep?mode=wait", ""), http.StatusServiceUnavailable)
		if s := e.Stats(); s.IsSleeping || s.Running != 1 {
			t.Fatalf("stats = %+v, want awake with the request still running", s)
		}
		wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`), http.StatusOK)
	})
}

func TestEngine_WaitingMetric(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{MaxNumSeqs: 1, TTFT: time.Second})
		h := e.Handler()
		a := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		b := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		synctest.Wait()
		m := metricValues(t, h)
		if m["vllm:num_requests_running"] != 1 || m["vllm:num_requests_waiting"] != 1 {
			t.Fatalf("metrics = %v, want 1 running and 1 waiting", m)
		}
		start := time.Now()
		wantCode(t, <-a, http.StatusOK)
		wantCode(t, <-b, http.StatusOK)
		if took := time.Since(start); took != 2*time.Second {
			t.Fatalf("both done after %v, want 2s (one at a time)", took)
		}
		if m := metricValues(t, h); m["vllm:num_requests_running"] != 0 || m["vllm:num_requests_waiting"] != 0 {
			t.Fatalf("metrics after = %v", m)
		}
	})
}

// exits records Options.Exit calls.
type exits struct {
	mu    sync.Mutex
	codes []int
}

func (x *exits) exit(code int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.codes = append(x.codes, code)
}

func (x *exits) get() []int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]int(nil), x.codes...)
}

func TestEngine_CrashAfterMidStream(t *testing.T) {
	var x exits
	h := New(Options{CrashAfter: 2, Exit: x.exit, Logger: quiet()}).Handler()
	wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x"}`), http.StatusOK)
	if got := x.get(); len(got) != 0 {
		t.Fatalf("exited %v after the first completion", got)
	}
	rec := do(h, "POST", "/v1/chat/completions", `{"messages":[{"content":"x"}],"stream":true}`)
	if got := x.get(); len(got) != 1 || got[0] != CrashExitCode {
		t.Fatalf("exit calls = %v, want [%d]", got, CrashExitCode)
	}
	events := sseEvents(t, rec.Body.String())
	// role + crashChunks tokens, then nothing: a truncated stream.
	if len(events) != 1+crashChunks || strings.Contains(rec.Body.String(), "[DONE]") {
		t.Fatalf("events before the crash = %q", events)
	}
}

func TestEngine_CrashAfterAnswersFirst(t *testing.T) {
	var x exits
	h := New(Options{CrashAfter: 1, Exit: x.exit, Logger: quiet()}).Handler()
	rec := do(h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":2}`)
	wantCode(t, rec, http.StatusOK)
	if !strings.Contains(rec.Body.String(), "tok1 tok2") {
		t.Fatalf("answer before the crash = %s", rec.Body)
	}
	if got := x.get(); len(got) != 1 || got[0] != CrashExitCode {
		t.Fatalf("exit calls = %v", got)
	}
}

func TestEngine_ControlRequestsRecorded(t *testing.T) {
	h := newEngine(Options{SleepMode: true}).Handler()
	do(h, "POST", "/sleep?level=2&mode=wait", `{"level":1}`)
	do(h, "GET", "/is_sleeping", "")
	do(h, "POST", "/wake_up?tags=weights&tags=kv_cache", "")
	do(h, "POST", "/v1/completions", `{"prompt":"secret prompt"}`)
	do(h, "GET", "/health", "")
	got := decode[[]ControlRequest](t, do(h, "GET", "/debug/requests", ""))
	want := []ControlRequest{
		{Method: "POST", Path: "/sleep", Query: "level=2&mode=wait", Body: `{"level":1}`},
		{Method: "GET", Path: "/is_sleeping"},
		{Method: "POST", Path: "/wake_up", Query: "tags=weights&tags=kv_cache"},
	}
	if len(got) != len(want) {
		t.Fatalf("control requests = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestEngine_ControlLogIsBounded(t *testing.T) {
	e := newEngine(Options{SleepMode: true})
	h := e.Handler()
	for range maxControlLog + 5 {
		do(h, "GET", "/is_sleeping", "")
	}
	if n := len(e.ControlRequests()); n != maxControlLog {
		t.Fatalf("kept %d control requests, want %d", n, maxControlLog)
	}
}

func TestEngine_SGLangReleaseResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(Options{SleepMode: true, MemoryBytes: 1 << 20, TTFT: time.Second})
		h := e.Handler()
		running := async(t.Context(), h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`)
		synctest.Wait()
		wantCode(t, do(h, "POST", "/release_memory_occupation", ""), http.StatusBadRequest)
		wantCode(t, <-running, http.StatusOK)

		wantCode(t, do(h, "POST", "/release_memory_occupation", `{"tags":["kv_cache"]}`), http.StatusOK)
		if s := e.Stats(); !s.IsSleeping || s.WeightsBytes != 1<<20 {
			t.Fatalf("after releasing kv_cache: %+v", s)
		}
		wantCode(t, do(h, "POST", "/resume_memory_occupation", `{"tags":["weights"]}`), http.StatusBadRequest)
		wantCode(t, do(h, "POST", "/release_memory_occupation", ""), http.StatusOK)
		wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x"}`), http.StatusServiceUnavailable)
		wantCode(t, do(h, "POST", "/resume_memory_occupation", ""), http.StatusOK)
		if s := e.Stats(); s.IsSleeping || s.SleepState != "awake" {
			t.Fatalf("after resume: %+v", s)
		}
		wantCode(t, do(h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`), http.StatusOK)
	})
}

func TestEngine_ConcurrentTraffic(t *testing.T) {
	e := newEngine(Options{SleepMode: true, MaxNumSeqs: 4})
	h := e.Handler()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			switch i % 4 {
			case 0:
				do(h, "POST", "/sleep", "")
			case 1:
				do(h, "POST", "/wake_up", "")
			default:
				rec := do(h, "POST", "/v1/completions", `{"prompt":"x","max_tokens":4,"stream":true}`)
				io.Copy(io.Discard, rec.Body)
			}
		})
	}
	wg.Wait()
	if s := e.Stats(); s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("stats after the traffic = %+v", s)
	}
}

// vLLM's priority field: refused when not 0 unless the engine runs with
// --scheduling-policy priority, and counted in /debug/stats.
func TestEngine_PriorityField(t *testing.T) {
	body := func(p string) string {
		return `{"model":"demo","max_tokens":1,"messages":[{"role":"user","content":"hi"}]` + p + `}`
	}
	fcfs := newEngine(Options{}).Handler()
	wantCode(t, do(fcfs, "POST", "/v1/chat/completions", body(`,"priority":0`)), http.StatusOK)
	rec := do(fcfs, "POST", "/v1/chat/completions", body(`,"priority":2`))
	wantCode(t, rec, http.StatusBadRequest)
	if !strings.Contains(rec.Body.String(), "Priority scheduling is not enabled") {
		t.Errorf("refusal %s", rec.Body.String())
	}
	prio := newEngine(Options{PriorityScheduling: true}).Handler()
	for _, p := range []string{``, `,"priority":2`, `,"priority":2`, `,"priority":0`} {
		wantCode(t, do(prio, "POST", "/v1/chat/completions", body(p)), http.StatusOK)
	}
	got := decode[Stats](t, do(prio, "GET", "/debug/stats", "")).Priorities
	if len(got) != 3 || got["none"] != 1 || got["2"] != 2 || got["0"] != 1 {
		t.Errorf("priorities %v", got)
	}
}
