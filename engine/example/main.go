// Command example is a model worker that speaks the engine contract: it
// answers OpenAI-style chat completions by echoing the last message, streams
// them as SSE when asked, and admits a bounded number of requests at once.
// It shows the whole contract in one small file; run it with
//
//	go run ./engine/example --bind ipc:///tmp/echo.sock
//
// and point a napd model with transport = "zmq" at the same address.
//
// It is an example and must not be imported.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/napd/napd/engine"
)

func main() {
	bind := flag.String("bind", "ipc:///tmp/napd-echo.sock", "address to serve on")
	load := flag.Duration("load-time", 0, "simulated model load time (NotReady until it passes)")
	capacity := flag.Uint64("capacity", 4, "requests admitted at once; more are refused with NoRoom")
	perWord := flag.Duration("word-delay", 20*time.Millisecond, "simulated time per generated word")
	flag.Parse()
	if err := run(*bind, *load, *capacity, *perWord); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run(bind string, load time.Duration, capacity uint64, perWord time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w := &echo{readyAt: time.Now().Add(load), capacity: capacity, perWord: perWord}
	return engine.Serve(ctx, w, bind, engine.WithLogger(slog.Default()))
}

// echo is the worker. It implements Worker, ContextSubmitter and Reporter.
type echo struct {
	readyAt  time.Time
	capacity uint64
	perWord  time.Duration
	busy     atomic.Uint64
	rejected atomic.Uint64
}

func (e *echo) Readiness() engine.Readiness {
	if time.Now().Before(e.readyAt) {
		return engine.Readiness{State: engine.NotReady, Reason: "loading weights"}
	}
	return engine.Readiness{State: engine.Ready}
}

func (e *echo) Report() engine.Report {
	return engine.Report{
		Depth:    engine.Measured(e.busy.Load()),
		Capacity: engine.Measured(e.capacity),
		Rejected: engine.Measured(e.rejected.Load()),
	}
}

// Submit is required by Worker; Serve prefers SubmitContext, which also
// learns of cancels, and enforces the deadline itself.
func (e *echo) Submit(body []byte, _ time.Time) engine.Reply {
	return e.SubmitContext(context.Background(), body)
}

type chatRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Content string `json:"content"`
	} `json:"messages"`
}

func (e *echo) SubmitContext(ctx context.Context, body []byte) engine.Reply {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return engine.Refused(engine.InvalidRequest, "body is not JSON: "+err.Error())
	}
	if len(req.Messages) == 0 {
		return engine.Refused(engine.InvalidRequest, "messages is empty")
	}
	if e.busy.Add(1) > e.capacity {
		e.busy.Add(^uint64(0))
		e.rejected.Add(1)
		return engine.Refused(engine.NoRoom, fmt.Sprintf("all %d slots are busy", e.capacity))
	}
	words := strings.Fields(req.Messages[len(req.Messages)-1].Content)
	out := make(chan engine.Part, 1)
	go func() {
		defer close(out)
		defer e.busy.Add(^uint64(0))
		e.generate(ctx, req, words, out)
	}()
	return out
}

// generate produces the answer word by word, as chunks when streaming.
func (e *echo) generate(ctx context.Context, req chatRequest, words []string, out chan<- engine.Part) {
	var text strings.Builder
	for i, w := range words {
		select {
		case <-ctx.Done():
			return // cancelled or past the deadline: Serve has answered already
		case <-time.After(e.perWord):
		}
		if i > 0 {
			w = " " + w
		}
		text.WriteString(w)
		if req.Stream {
			out <- engine.Part{Chunk: &engine.Chunk{Data: sse(req.Model, w), ContentType: "text/event-stream"}}
		}
	}
	if req.Stream {
		out <- engine.Part{Answer: &engine.Answer{Body: []byte("data: [DONE]\n\n")}}
		return
	}
	b, _ := json.Marshal(map[string]any{
		"object": "chat.completion",
		"model":  req.Model,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       map[string]string{"role": "assistant", "content": text.String()},
			"finish_reason": "stop",
		}},
	})
	out <- engine.Part{Answer: &engine.Answer{Body: b, ContentType: "application/json"}}
}

func sse(model, delta string) []byte {
	b, _ := json.Marshal(map[string]any{
		"object":  "chat.completion.chunk",
		"model":   model,
		"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": delta}}},
	})
	return []byte("data: " + string(b) + "\n\n")
}
