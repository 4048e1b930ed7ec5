package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// engineFlags configure the bench's own minimal engine (the program run
// with -engine). It is a tiny OpenAI-shaped server that costs almost
// nothing per request, so what the bench measures is napd, and that stamps
// every SSE chunk with its wall-clock send time, so a client on the same
// host can tell how long each chunk spent in napd.
type engineFlags struct {
	port         int
	startupDelay time.Duration
	readyFile    string // where to write the unix-nano moment /health turns 200
	procs        int    // GOMAXPROCS; 0: Go's default
}

// completionBody is the fixed non-streamed answer: small, like a short
// chat completion.
var completionBody = []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"tok1 tok2 tok3 tok4"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5}}`)

// benchRequest is what the engine reads of a request: the stream flag, the
// chunk count and the pause between chunks (a bench-only field; napd
// forwards bodies unchanged).
type benchRequest struct {
	Stream     bool `json:"stream"`
	MaxTokens  int  `json:"max_tokens"`
	IntervalMs int  `json:"bench_interval_ms"`
}

// runEngine serves until SIGTERM.
func runEngine(f engineFlags) error {
	if f.procs > 0 {
		runtime.GOMAXPROCS(f.procs)
	}
	readyAt := time.Now().Add(f.startupDelay)
	if f.readyFile != "" {
		// Known in advance: /health turns 200 at readyAt exactly.
		if err := os.WriteFile(f.readyFile, []byte(strconv.FormatInt(readyAt.UnixNano(), 10)), 0o644); err != nil {
			return fmt.Errorf("engine: ready file: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if time.Now().Before(readyAt) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /v1/chat/completions", serveCompletion)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", f.port))
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	srv := &http.Server{Handler: mux}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close() // ends open streams at once
	}()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

func serveCompletion(w http.ResponseWriter, r *http.Request) {
	var req benchRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad JSON","type":"invalid_request_error","code":"invalid_json","param":null}}`, http.StatusBadRequest)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(completionBody)))
		_, _ = w.Write(completionBody)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	interval := time.Duration(req.IntervalMs) * time.Millisecond
	buf := make([]byte, 0, 256)
	for i := range max(req.MaxTokens, 1) {
		if i > 0 && interval > 0 {
			select {
			case <-time.After(interval):
			case <-r.Context().Done():
				return
			}
		}
		buf = append(buf[:0], `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","t":`...)
		buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
		buf = append(buf, `,"choices":[{"index":0,"delta":{"content":"tok "}}]}`+"\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
	_, _ = w.Write([]byte("data: [DONE]\n\n"))
}
