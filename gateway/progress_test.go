package gateway

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
)

// progressModels offers wake progress for m1 only.
type progressModels struct{ *fakeModels }

func (progressModels) Progress(model string) (ProgressNote, bool) {
	return ProgressNote{Label: "waking " + model}, model == "m1"
}

// progressEnv is a gateway over progressModels whose Admit waits for
// release, then returns what answer gives.
func progressEnv(t *testing.T, engine http.HandlerFunc, answer func(*fakeModels) (*Ticket, error)) (url string, release chan struct{}, models *fakeModels) {
	t.Helper()
	e := newEnv(t, engine, Options{})
	release = make(chan struct{})
	e.models.admit = func(ctx context.Context, a lease.Request) (*Ticket, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return answer(e.models)
	}
	gw := New(Options{RequestTimeout: 10 * time.Second, Logger: e.gw.log, ProgressAfter: time.Millisecond, ProgressEvery: time.Millisecond}, progressModels{e.models})
	srv := serveGateway(t, gw.Handler(), nil)
	return srv.URL, release, e.models
}

// oneChunkEngine streams one chunk and [DONE].
func oneChunkEngine(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
}

// A streaming request that waits gets 200 and SSE comments before its
// model is admitted, then the engine's stream.
func TestWakeProgress_CommentsUntilTheFirstToken(t *testing.T) {
	url, release, models := progressEnv(t, oneChunkEngine, func(f *fakeModels) (*Ticket, error) { return f.ticket(0), nil })
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m1","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("early answer: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, ": waking m1, ") || !strings.HasSuffix(line, " s\n") {
		t.Fatalf("first line %q, %v; want a progress comment", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(r)
	if !strings.Contains(string(rest), `"content":"hi"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("stream after the comments: %q", rest)
	}
	if o := models.outcome(); o.Cancelled {
		t.Error("a complete stream reported cancelled")
	}
}

// Once the status is out, a refusal (or an engine's error) ends the stream
// with an OpenAI-shaped error event.
func TestWakeProgress_LateFailureIsAnErrorEvent(t *testing.T) {
	url, release, _ := progressEnv(t, oneChunkEngine, func(*fakeModels) (*Ticket, error) {
		return nil, &Refusal{Status: 503, Code: "insufficient_gpu_memory", Message: "cannot fit m1", RetryAfter: time.Second}
	})
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m1","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if line, _ := r.ReadString('\n'); !strings.HasPrefix(line, ": waking m1") {
		t.Fatalf("first line %q", line)
	}
	close(release)
	body, _ := io.ReadAll(r)
	want := `data: {"error":{"message":"cannot fit m1","type":"server_error","code":"insufficient_gpu_memory","param":null}}` + "\n\n"
	if resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), want) {
		t.Fatalf("%d, stream %q\nwant it to end with %q", resp.StatusCode, body, want)
	}
}

// Without the opt-in, or for a request that does not stream, the status
// waits for the outcome.
func TestWakeProgress_OnlyStreamsOfModelsThatOptIn(t *testing.T) {
	for _, body := range []string{`{"model":"m2","stream":true}`, `{"model":"m1","stream":false}`} {
		url, release, _ := progressEnv(t, oneChunkEngine, func(*fakeModels) (*Ticket, error) {
			return nil, &Refusal{Status: 503, Code: "queue_full", Message: "full"}
		})
		go func() { time.Sleep(20 * time.Millisecond); close(release) }()
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || strings.HasPrefix(string(b), ":") {
			t.Errorf("%s: %d %q, want a plain 503", body, resp.StatusCode, b)
		}
	}
}

// The model layer learns when a stream was committed early (its client
// has bytes): from then on the request must not be sent elsewhere.
func TestWakeProgress_AdmitLearnsTheStreamStarted(t *testing.T) {
	e := newEnv(t, oneChunkEngine, Options{})
	release := make(chan struct{})
	before, after := make(chan bool, 1), make(chan bool, 1)
	e.models.admit = func(ctx context.Context, a lease.Request) (*Ticket, error) {
		before <- Committed(ctx)
		<-release
		after <- Committed(ctx)
		return e.models.ticket(0), nil
	}
	gw := New(Options{RequestTimeout: 10 * time.Second, Logger: e.gw.log, ProgressAfter: time.Millisecond, ProgressEvery: time.Hour}, progressModels{e.models})
	srv := serveGateway(t, gw.Handler(), nil)
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m1","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if c := <-before; c {
		t.Error("committed before anything was sent")
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	close(release)
	if c := <-after; !c {
		t.Error("not committed once the client had a comment")
	}
	e.models.outcome()
	if Committed(context.Background()) {
		t.Error("a request without wake progress reads as committed")
	}
}

func TestProgressNote_Comment(t *testing.T) {
	for _, tc := range []struct {
		n    ProgressNote
		want string
	}{
		{ProgressNote{Label: "waking m1"}, ": waking m1, 12 s\n\n"},
		{ProgressNote{Label: "demo-large loading 43 % (7.1 of 16.4 GiB), about 12 s left", Measured: true},
			": demo-large loading 43 % (7.1 of 16.4 GiB), about 12 s left\n\n"},
	} {
		if got := tc.n.comment(12500 * time.Millisecond); got != tc.want {
			t.Errorf("comment(%+v) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
