package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/request"
)

func TestGateway_ForwardsBodyByteForByte(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	// Odd spacing, key order, unicode escapes and an unknown field: all must
	// reach the engine exactly as sent.
	body := "{ \"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9llo\"}],\n\t\"model\" : \"a1\", \"x\":1.50 }"
	resp, got := e.do("POST", "/v1/chat/completions?trace=1", body, map[string]string{"X-Custom": "v"})
	if resp.StatusCode != 200 || string(got) != `{"ok":true}` {
		t.Fatalf("status %d body %s", resp.StatusCode, got)
	}
	if resp.Header.Get("X-Engine") != "yes" {
		t.Error("engine header not passed back")
	}
	if resp.Header.Get(HeaderQueueDepth) != "3" {
		t.Errorf("X-Queue-Depth %q, want 3", resp.Header.Get(HeaderQueueDepth))
	}
	if resp.Header.Get(HeaderWakeMs) != "" {
		t.Errorf("X-Napd-Wake-Ms %q without a wake", resp.Header.Get(HeaderWakeMs))
	}
	s := eng.seen()
	if len(s) != 1 {
		t.Fatalf("engine saw %d requests", len(s))
	}
	if string(s[0].body) != body {
		t.Errorf("engine body %q, want %q", s[0].body, body)
	}
	if s[0].method != "POST" || s[0].path != "/v1/chat/completions" || s[0].query != "trace=1" {
		t.Errorf("engine saw %s %s?%s", s[0].method, s[0].path, s[0].query)
	}
	if s[0].header.Get("X-Custom") != "v" || s[0].header.Get("X-Forwarded-For") == "" {
		t.Errorf("engine headers %v", s[0].header)
	}
	want := lease.Request{Model: "m1", Kind: request.Chat, ByName: true}
	if a := e.models.admitted(); len(a) != 1 || a[0] != want {
		t.Errorf("admissions %+v, want %+v", a, want)
	}
	if o := e.models.outcome(); o.Cancelled || o.Response != nil {
		t.Errorf("outcome %+v", o)
	}
	if obs := e.waitObservations(1); len(obs) != 1 || obs[0] != (observation{"m1", 200}) {
		t.Errorf("observations %+v", obs)
	}
}

func TestGateway_KindAndStreamFromRequest(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	cases := []struct {
		path, body string
		want       lease.Request
	}{
		{"/v1/chat/completions", `{"model":"m1","stream":true}`, lease.Request{Model: "m1", Kind: request.Chat, Stream: true}},
		{"/v1/completions", `{"model":"m2"}`, lease.Request{Model: "m2", Kind: request.Completion}},
		{"/v1/embeddings", `{"model":"a1","stream":false}`, lease.Request{Model: "m1", Kind: request.Embedding}},
		{"/v1/audio/speech", `{"model":"m1"}`, lease.Request{Model: "m1", Kind: request.Other}},
	}
	for _, c := range cases {
		resp, b := e.do("POST", c.path, c.body, map[string]string{HeaderIdempotencyKey: "k-" + c.path})
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, b)
		}
		e.models.outcome()
	}
	got := e.models.admitted()
	for i, c := range cases {
		c.want.IdempotencyKey, c.want.ByName = "k-"+c.path, true
		if len(got[i].Fingerprint) != 64 {
			t.Errorf("%s: fingerprint %q", c.path, got[i].Fingerprint)
		}
		got[i].Fingerprint = ""
		if got[i] != c.want {
			t.Errorf("%s: admission %+v, want %+v", c.path, got[i], c.want)
		}
	}
}

func TestGateway_ClientErrors(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{MaxBody: 64})
	cases := []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		code                     string
		queueDepth               bool
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", `{"model":`, nil, 400, "invalid_json", false},
		{"not an object", "POST", "/v1/chat/completions", `[1,2]`, nil, 400, "invalid_json", false},
		{"no model", "POST", "/v1/chat/completions", `{"messages":[]}`, nil, 400, "missing_model", false},
		{"unknown model", "POST", "/v1/completions", `{"model":"nope"}`, nil, 404, "model_not_found", false},
		{"unknown path", "GET", "/v2/whatever", ``, nil, 404, "not_found", false},
		{"GET on a POST route", "GET", "/v1/chat/completions", ``, nil, 405, "method_not_allowed", false},
		{"body over max_body", "POST", "/v1/chat/completions", `{"model":"m1","pad":"` + strings.Repeat("x", 100) + `"}`, nil, 413, "request_too_large", false},
		{"bad X-Request-Timeout", "POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderRequestTimeout: "soon"}, 400, "invalid_request_timeout", false},
		{"negative X-Request-Timeout", "POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderRequestTimeout: "-5"}, 400, "invalid_request_timeout", false},
		{"unknown upstream model", "GET", "/upstream/nope/health", ``, nil, 404, "model_not_found", false},
		{"unknown model by id", "GET", "/v1/models/nope", ``, nil, 404, "model_not_found", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := e.do(c.method, c.path, c.body, c.header)
			wantError(t, resp, b, c.status, c.code)
		})
	}
	t.Run("chunked body over max_body", func(t *testing.T) {
		// No Content-Length: the limit is found while reading.
		body := io.MultiReader(strings.NewReader(`{"model":"m1","pad":"`), strings.NewReader(strings.Repeat("x", 100)+`"}`))
		req, _ := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", body)
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		wantError(t, resp, b, 413, "request_too_large")
	})
	if n := len(eng.seen()); n != 0 {
		t.Errorf("engine saw %d requests", n)
	}
	if n := len(e.models.admitted()); n != 0 {
		t.Errorf("Admit called %d times", n)
	}
}

func TestGateway_RefusalAnswersItsStatusWithRetryAfter(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	e.models.admit = func(context.Context, lease.Request) (*Ticket, error) {
		return nil, &Refusal{Code: "model_failed", Message: "m1 failed: exit status 1 after 3 attempts", RetryAfter: 1500 * time.Millisecond}
	}
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	wantError(t, resp, b, 503, "model_failed")
	if ra := resp.Header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After %q, want 2 (rounded up)", ra)
	}
	if !strings.Contains(string(b), "after 3 attempts") {
		t.Errorf("body %s does not carry the refusal's message", b)
	}
	if resp.Header.Get(HeaderQueueDepth) != "3" {
		t.Errorf("X-Queue-Depth %q", resp.Header.Get(HeaderQueueDepth))
	}

	e.models.admit = func(context.Context, lease.Request) (*Ticket, error) {
		return nil, &Refusal{Status: 429, Code: "too_many", Message: "slow down"}
	}
	resp, b = e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	wantError(t, resp, b, 429, "too_many")
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After %q without RetryAfter", ra)
	}
}

// blockingAdmit waits until its context ends and reports why.
func blockingAdmit(reason chan<- error) func(ctx context.Context, a lease.Request) (*Ticket, error) {
	return func(ctx context.Context, _ lease.Request) (*Ticket, error) {
		<-ctx.Done()
		reason <- ctx.Err()
		return nil, ctx.Err()
	}
}

func TestGateway_DeadlineInAdmitIs504(t *testing.T) {
	cases := []struct {
		name    string
		timeout time.Duration
		header  string
	}{
		{"request_timeout", 100 * time.Millisecond, ""},
		{"X-Request-Timeout shortens", time.Hour, "0.1"},
		{"X-Request-Timeout as duration", time.Hour, "100ms"},
		{"X-Request-Timeout never lengthens", 100 * time.Millisecond, "1h"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, (&okEngine{}).ServeHTTP, Options{RequestTimeout: c.timeout})
			reason := make(chan error, 1)
			e.models.admit = blockingAdmit(reason)
			h := map[string]string{}
			if c.header != "" {
				h[HeaderRequestTimeout] = c.header
			}
			start := time.Now()
			resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, h)
			wantError(t, resp, b, 504, "timeout")
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("504 after %v", d)
			}
			if err := <-reason; !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Admit context ended with %v", err)
			}
			if resp.Header.Get(HeaderQueueDepth) == "" {
				t.Error("no X-Queue-Depth on 504")
			}
		})
	}
}

func TestGateway_SlowUploadIs504(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{RequestTimeout: 150 * time.Millisecond})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Announce 100 bytes, send 10, then stall.
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response to a stalled upload: %v\n%s", err, e.logs.String())
	}
	b, _ := io.ReadAll(resp.Body)
	wantError(t, resp, b, 504, "timeout")
	if n := len(e.models.admitted()); n != 0 {
		t.Errorf("Admit called for an incomplete body")
	}
}

func TestGateway_SlowEngineIs504AndEngineSeesCancel(t *testing.T) {
	engineCancelled := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		// net/http notices a client leaving only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
		close(engineCancelled)
	}, Options{})
	resp, b := e.do("POST", "/v1/completions", `{"model":"m1"}`, map[string]string{HeaderRequestTimeout: "100ms"})
	wantError(t, resp, b, 504, "timeout")
	if resp.Header.Get(HeaderQueueDepth) == "" {
		t.Error("no X-Queue-Depth on 504")
	}
	waitClosed(t, engineCancelled, "engine request context")
	if o := e.models.outcome(); !o.Cancelled {
		t.Errorf("outcome %+v, want Cancelled", o)
	}
}

func TestGateway_EngineConnectionFailureIs502(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
		e.engine.Close() // nothing listens on the target any more
		resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
		wantError(t, resp, b, 502, "engine_unreachable")
		if resp.Header.Get(HeaderQueueDepth) == "" {
			t.Error("no X-Queue-Depth on 502")
		}
		if o := e.models.outcome(); !o.Cancelled {
			t.Errorf("outcome %+v, want Cancelled", o)
		}
	})
	t.Run("reset before headers", func(t *testing.T) {
		e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}, Options{})
		resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
		wantError(t, resp, b, 502, "engine_unreachable")
		if o := e.models.outcome(); !o.Cancelled {
			t.Errorf("outcome %+v, want Cancelled", o)
		}
	})
	t.Run("transport error", func(t *testing.T) {
		e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
		e.models.transport = roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, errWorkerDead
		})
		resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
		wantError(t, resp, b, 502, "engine_unreachable")
		e.models.outcome()
	})
}

var errWorkerDead = errors.New("zmq worker dead")

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not seen within 5s", what)
	}
}

// sseEngine sends one event, waits for next, sends a second and ends.
func sseEngine(next <-chan struct{}, cancelled chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			close(cancelled)
			return
		}
		fmt.Fprint(w, "data: two\n\n")
	}
}

func TestGateway_SSEPassesChunkByChunk(t *testing.T) {
	next := make(chan struct{})
	e := newEnv(t, sseEngine(next, make(chan struct{})), Options{})
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`))
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	// The engine holds the second event until we have read the first: a
	// gateway that buffered would deadlock here.
	if line, err := r.ReadString('\n'); err != nil || line != "data: one\n" {
		t.Fatalf("first chunk %q, %v", line, err)
	}
	e.models.noMoreDone() // the lease is held while the stream is open
	close(next)
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
	if o := e.models.outcome(); o.Cancelled {
		t.Errorf("outcome %+v", o)
	}
	if a := e.models.admitted(); !a[0].Stream {
		t.Error("admission not marked as stream")
	}
}

func TestGateway_ClientDisconnectMidStreamCancelsEngine(t *testing.T) {
	cancelled := make(chan struct{})
	e := newEnv(t, sseEngine(make(chan struct{}), cancelled), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`))
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: one\n" {
		t.Fatalf("first chunk %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	waitClosed(t, cancelled, "engine request context")
	if o := e.models.outcome(); !o.Cancelled {
		t.Errorf("outcome %+v, want Cancelled", o)
	}
	e.models.noMoreDone()
}

func TestGateway_DeadlineCutsAnOpenStream(t *testing.T) {
	cancelled := make(chan struct{})
	e := newEnv(t, sseEngine(make(chan struct{}), cancelled), Options{RequestTimeout: 200 * time.Millisecond})
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`))
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("stream ended cleanly after %q; want it cut", b)
	}
	if string(b) != "data: one\n\n" {
		t.Errorf("got %q before the cut", b)
	}
	waitClosed(t, cancelled, "engine request context")
	if o := e.models.outcome(); !o.Cancelled {
		t.Errorf("outcome %+v, want Cancelled", o)
	}
}

func TestGateway_ClientDisconnectWhileQueuedWritesNothing(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	reason := make(chan error, 1)
	e.models.admit = blockingAdmit(reason)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for len(e.models.admitted()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m1"}`))
	if resp, err := e.client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("request succeeded after cancel")
	}
	select {
	case err := <-reason:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Admit context ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Admit context not cancelled")
	}
	if obs := e.waitObservations(1); len(obs) != 1 || obs[0] != (observation{"m1", StatusClientClosed}) {
		t.Errorf("observations %+v", obs)
	}
	if strings.Contains(e.logs.String(), "level\":\"ERROR") {
		t.Errorf("a client that left was logged as an error:\n%s", e.logs.String())
	}
}

func TestGateway_WakeAndEngineQueueDepthHeaders(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderQueueDepth, "7") // a worker that measures its own queue
		_, _ = w.Write([]byte("{}"))
	}, Options{})
	e.models.wake = 1500 * time.Millisecond
	resp, _ := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	if got := resp.Header.Get(HeaderQueueDepth); got != "7" {
		t.Errorf("X-Queue-Depth %q, want the engine's 7", got)
	}
	if got := resp.Header.Get(HeaderWakeMs); got != "1500" {
		t.Errorf("X-Napd-Wake-Ms %q, want 1500", got)
	}
	e.models.outcome()
}

func TestGateway_IdempotentResponseIsCapturedForDone(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderIdempotencyKey: "abc"})
	o := e.models.outcome()
	if o.Cancelled || o.Response == nil {
		t.Fatalf("outcome %+v", o)
	}
	r := o.Response
	if r.Status != 200 || string(r.Body) != `{"ok":true}` || r.Header.Get("X-Engine") != "yes" {
		t.Errorf("stored %d %v %q", r.Status, r.Header, r.Body)
	}
	for _, h := range []string{HeaderQueueDepth, HeaderWakeMs, "Connection", "Transfer-Encoding"} {
		if r.Header.Get(h) != "" {
			t.Errorf("stored header %s", h)
		}
	}

	// Without a key nothing is captured.
	e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	if o := e.models.outcome(); o.Response != nil {
		t.Errorf("captured without a key: %+v", o)
	}
}

func TestGateway_OversizedIdempotentResponseIsNotStored(t *testing.T) {
	big := strings.Repeat("x", maxStored+1)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, big) }, Options{})
	_, b := e.do("POST", "/v1/completions", `{"model":"m1"}`, map[string]string{HeaderIdempotencyKey: "abc"})
	if len(b) != len(big) {
		t.Fatalf("client got %d bytes", len(b))
	}
	if o := e.models.outcome(); o.Cancelled || o.Response != nil {
		t.Errorf("outcome Cancelled=%v stored=%v", o.Cancelled, o.Response != nil)
	}
}

func TestGateway_ReplayIsWrittenWithoutTheEngine(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	stored := &lease.Stored{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Engine": {"earlier"}}, Body: []byte(`{"id":"r1"}`)}
	doneCalls := make(chan Outcome, 2)
	e.models.admit = func(context.Context, lease.Request) (*Ticket, error) {
		return &Ticket{Replay: stored, Done: func(o Outcome) { doneCalls <- o }}, nil
	}
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderIdempotencyKey: "abc"})
	if resp.StatusCode != 201 || string(b) != `{"id":"r1"}` {
		t.Fatalf("replay %d %s", resp.StatusCode, b)
	}
	if resp.Header.Get(HeaderReplayed) != "true" || resp.Header.Get("X-Engine") != "earlier" || resp.Header.Get(HeaderQueueDepth) != "3" {
		t.Errorf("replay headers %v", resp.Header)
	}
	if len(eng.seen()) != 0 {
		t.Error("engine saw a replayed request")
	}
	if o := <-doneCalls; o.Cancelled {
		t.Errorf("replay outcome %+v", o)
	}
	if len(doneCalls) != 0 {
		t.Error("Done called twice")
	}
}

func TestGateway_UpstreamPassesMethodPathAndQuery(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	resp, _ := e.do("PUT", "/upstream/a1/some/deep%2Fpath?x=1&y=two", "raw body, not JSON", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	s := eng.seen()[0]
	if s.method != "PUT" || s.path != "/some/deep/path" || s.query != "x=1&y=two" || string(s.body) != "raw body, not JSON" {
		t.Errorf("engine saw %s %s?%s %q", s.method, s.path, s.query, s.body)
	}
	if a := e.models.admitted()[0]; a != (lease.Request{Model: "m1", Kind: request.Other}) {
		t.Errorf("admission %+v", a)
	}
	e.models.outcome()

	e.do("GET", "/upstream/m2/metrics", "", nil)
	if s := eng.seen()[1]; s.method != "GET" || s.path != "/metrics" {
		t.Errorf("engine saw %s %s", s.method, s.path)
	}
	e.models.outcome()
}

func TestGateway_ModelHandlerRoutesEverythingToItsModel(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	srv := newServer(t, e.gw.ModelHandler("m2"))
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m1","stream":true}`},
		{"/v1/models", ``},
		{"/v1/anything", `not json`},
	} {
		method := "POST"
		if c.body == "" {
			method = "GET"
		}
		req, _ := http.NewRequest(method, srv+c.path, strings.NewReader(c.body))
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get(HeaderQueueDepth) != "3" {
			t.Errorf("%s: %d %v", c.path, resp.StatusCode, resp.Header)
		}
		e.models.outcome()
	}
	seen := eng.seen()
	for i, p := range []string{"/v1/chat/completions", "/v1/models", "/v1/anything"} {
		if seen[i].path != p {
			t.Errorf("engine path %q, want %q", seen[i].path, p)
		}
	}
	a := e.models.admitted()
	want := []lease.Request{{Model: "m2", Kind: request.Chat, Stream: true}, {Model: "m2", Kind: request.Other}, {Model: "m2", Kind: request.Other}}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("admissions %+v, want %+v", a, want)
	}
	resp, err := e.client.Get(srv + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(eng.seen()) != 3 {
		t.Errorf("/health on a model socket: %d, engine saw %d", resp.StatusCode, len(eng.seen()))
	}
}

func TestGateway_HealthAndModels(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	resp, b := e.do("GET", "/health", "", nil)
	if resp.StatusCode != 200 || string(b) != `{"status":"ok"}` {
		t.Errorf("/health %d %s", resp.StatusCode, b)
	}
	resp, b = e.do("GET", "/v1/models", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("/v1/models %d", resp.StatusCode)
	}
	var list struct {
		Object string
		Data   []struct {
			ID, Object string
			Created    int64
			OwnedBy    string `json:"owned_by"`
			Napd       struct {
				State, Reason string
				Aliases       []string
			}
		}
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 2 {
		t.Fatalf("list %s", b)
	}
	m1, m2 := list.Data[0], list.Data[1]
	if m1.ID != "m1" || m1.Object != "model" || m1.OwnedBy != "napd" || m1.Created == 0 || m1.Napd.State != "awake" || !reflect.DeepEqual(m1.Napd.Aliases, []string{"a1"}) {
		t.Errorf("m1 %+v", m1)
	}
	if m2.Napd.State != "failed" || m2.Napd.Reason == "" || m2.Napd.Aliases == nil {
		t.Errorf("m2 %+v (aliases must be [] not null)", m2)
	}
	resp, b = e.do("GET", "/v1/models/a1", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"m1"`) {
		t.Errorf("/v1/models/a1 %d %s", resp.StatusCode, b)
	}
}

func TestDepthValue(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 1000} {
		if v := depthValue(n); len(v) != 1 || v[0] != strconv.Itoa(n) || cap(v) != 1 {
			t.Errorf("depthValue(%d) = %q (cap %d)", n, v, cap(v))
		}
	}
}

// headerValue looks keys up as they are: each one napd asks for must be
// canonical, as the header maps' keys are.
func TestHeaderValueKeysAreCanonical(t *testing.T) {
	for _, k := range []string{"Authorization", "X-Api-Key", "Origin", "Access-Control-Request-Method",
		"Content-Type", HeaderQueueDepth, HeaderIdempotencyKey, HeaderRequestTimeout} {
		if c := http.CanonicalHeaderKey(k); c != k {
			t.Errorf("%q is not canonical (%q)", k, c)
		}
	}
	h := http.Header{}
	h.Add("x-request-timeout", "5")
	if v := headerValue(h, HeaderRequestTimeout); v != "5" {
		t.Errorf("headerValue = %q, want 5", v)
	}
}
