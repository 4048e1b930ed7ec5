package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestGateway_EngineControlPathsAreRefused(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{UpstreamDeny: []string{"/tokenize"}, UpstreamAllow: []string{"GET /is_sleeping"}})
	dedicated := newServer(t, e.gw.ModelHandler("m1"))
	refused := []struct{ method, url, body string }{
		{"POST", e.srv.URL + "/upstream/m1/sleep?level=1", ""},
		{"POST", e.srv.URL + "/upstream/m1/wake_up", ""},
		{"POST", e.srv.URL + "/upstream/m1/collective_rpc", `{"method":"x"}`},
		{"GET", e.srv.URL + "/upstream/m1/reset_prefix_cache", ""},
		{"POST", e.srv.URL + "/upstream/m1//sleep", ""},
		{"POST", e.srv.URL + "/upstream/m1/sleep/", ""},
		{"POST", e.srv.URL + "/upstream/m1/v1/../sleep", ""},
		{"POST", e.srv.URL + "/upstream/m1/%73leep", ""},
		{"POST", e.srv.URL + "/upstream/m1/SLEEP", ""},
		{"POST", e.srv.URL + "/upstream/a1/release_memory_occupation", ""},
		{"GET", e.srv.URL + "/upstream/m1/update_weights_from_disk", ""},
		{"POST", e.srv.URL + "/upstream/m1/update_weights_from_distributed_group", ""},
		{"POST", e.srv.URL + "/upstream/m1/slots/0?action=erase", ""},
		{"POST", e.srv.URL + "/upstream/m1/props", "{}"},
		{"POST", e.srv.URL + "/upstream/m1/tokenize", "{}"},  // upstream_deny adds
		{"POST", e.srv.URL + "/upstream/m1/is_sleeping", ""}, // allowed for GET only
		{"POST", e.srv.URL + "/v1/load_lora_adapter", `{"model":"m1","lora_name":"x"}`},
		{"POST", dedicated + "/wake_up", ""},
		{"PUT", dedicated + "/sleep", ""},
	}
	for _, c := range refused {
		req, _ := http.NewRequest(c.method, c.url, strings.NewReader(c.body))
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Run(c.method+" "+strings.TrimPrefix(c.url, "http://"), func(t *testing.T) {
			wantError(t, resp, b, http.StatusForbidden, "engine_control_refused")
		})
	}
	if n := len(eng.seen()); n != 0 {
		t.Errorf("engine saw %d control requests: %+v", n, eng.seen())
	}
	// Reads stay reachable, and so does what upstream_allow exempts.
	for _, path := range []string{"/upstream/m1/slots", "/upstream/m1/props", "/upstream/m1/health", "/upstream/m1/is_sleeping", "/upstream/m1/metrics"} {
		resp, b := e.do("GET", path, "", nil)
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		e.models.outcome()
	}
}

func TestGateway_RequestTimeoutThatRoundsToZeroIs400(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	for _, v := range []string{"1e-10", "0.0000001e-3", "0.0000000001", "0.1ns", "1e-400"} {
		resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderRequestTimeout: v})
		t.Run(v, func(t *testing.T) { wantError(t, resp, b, 400, "invalid_request_timeout") })
	}
	if n := len(e.models.admitted()); n != 0 {
		t.Errorf("Admit called %d times", n)
	}
}

func TestGateway_RoutingFieldsMatchExactly(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	for _, body := range []string{
		`{"model":"m1","MODEL":"m2"}`,
		`{"Model":"m2","model":"m1"}`,
		`{"model":"m1","model":"m2"}`,
		`{"model":"m1","stream":false,"Stream":true}`,
		`{"model":"m1","stream":false,"stream":true}`,
	} {
		resp, b := e.do("POST", "/v1/chat/completions", body, nil)
		t.Run(body, func(t *testing.T) { wantError(t, resp, b, 400, "ambiguous_field") })
	}
	// Only a case variant: the engine would see no "model" either.
	resp, b := e.do("POST", "/v1/chat/completions", `{"Model":"m1"}`, nil)
	if resp.StatusCode != 400 {
		t.Errorf(`{"Model":"m1"}: %d %s`, resp.StatusCode, b)
	}
	// The same ambiguity on a pass-through route is refused too.
	resp, b = e.do("POST", "/upstream/m1/v1/chat/completions", `{"model":"m1","MODEL":"m2"}`, nil)
	wantError(t, resp, b, 400, "ambiguous_field")
	if n := len(eng.seen()); n != 0 {
		t.Errorf("engine saw %d ambiguous requests", n)
	}
}

func TestGateway_IdempotencyFingerprintBindsTheRequest(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	send := func(path, body string) string {
		t.Helper()
		resp, b := e.do("POST", path, body, map[string]string{HeaderIdempotencyKey: "k"})
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		e.models.outcome()
		a := e.models.admitted()
		return a[len(a)-1].Fingerprint
	}
	first := send("/v1/chat/completions", `{"model":"m1","messages":[1]}`)
	if again := send("/v1/chat/completions", `{"model":"m1","messages":[1]}`); again != first {
		t.Error("the same request has another fingerprint")
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m1","messages":[2]}`},
		{"/v1/completions", `{"model":"m1","messages":[1]}`},
		{"/v1/chat/completions", `{"model":"m2","messages":[1]}`},
		{"/v1/chat/completions?x=1", `{"model":"m1","messages":[1]}`},
	} {
		if fp := send(c.path, c.body); fp == first {
			t.Errorf("%s %s: same fingerprint as the first request", c.path, c.body)
		}
	}
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderIdempotencyKey: strings.Repeat("k", MaxIdempotencyKey+1)})
	wantError(t, resp, b, 400, "invalid_idempotency_key")
}

func TestGateway_OnlyComplete2xxAnswersAreStored(t *testing.T) {
	status := make(chan int, 1)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(<-status)
		_, _ = io.WriteString(w, `{"error":{}}`)
	}, Options{})
	for _, code := range []int{500, 503, 429, 400, 404} {
		status <- code
		resp, _ := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderIdempotencyKey: "k"})
		want := code
		if code == http.StatusServiceUnavailable {
			want = http.StatusBadGateway // an engine's 503 goes out as 502
		}
		if resp.StatusCode != want {
			t.Fatalf("status %d, want %d", resp.StatusCode, want)
		}
		if o := e.models.outcome(); o.Response != nil {
			t.Errorf("%d answer stored for replay", code)
		}
	}

	// A stream the engine cuts (it dies mid-answer) is not complete.
	cut := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		conn, _, _ := http.NewResponseController(w).Hijack()
		conn.Close()
	}, Options{})
	req, _ := http.NewRequest("POST", cut.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`))
	req.Header.Set(HeaderIdempotencyKey, "k")
	if resp, err := cut.client.Do(req); err == nil {
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if o := cut.models.outcome(); !o.Cancelled || o.Response != nil {
		t.Errorf("cut stream: outcome Cancelled=%v stored=%v", o.Cancelled, o.Response != nil)
	}
}

// TestGateway_AnnouncedBodyReservesNoMemory holds many requests that
// announce a 16 MiB body and send one byte: napd's heap must not grow by
// what was announced (it did by 16 MiB each).
func TestGateway_AnnouncedBodyReservesNoMemory(t *testing.T) {
	const conns = 50
	reading := make(chan struct{}, conns)
	models := newFakeModels(t, "http://127.0.0.1:1")
	gw := New(Options{MaxBody: 16 << 20, Logger: slog.New(slog.DiscardHandler)}, models)
	h := gw.Handler()
	srv := serveGateway(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &signalBody{ReadCloser: r.Body, first: reading}
		h.ServeHTTP(w, r)
	}), nil)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", 16<<20)
	}
	for range conns {
		select {
		case <-reading:
		case <-time.After(30 * time.Second):
			t.Fatal("requests did not reach the body read")
		}
	}
	var after runtime.MemStats
	runtime.GC() // what is left is what the open requests hold
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %d KiB for %d announced 16 MiB bodies", grown>>10, conns)
	if limit := int64(conns) * 512 << 10; grown > limit {
		t.Errorf("heap grew %d MiB for %d connections that sent one byte each (limit %d MiB)", grown>>20, conns, limit>>20)
	}
}

// signalBody reports its first Read: the gateway has then sized its
// buffer and waits for bytes.
type signalBody struct {
	io.ReadCloser
	first chan<- struct{}
	once  sync.Once
}

func (b *signalBody) Read(p []byte) (int, error) {
	b.once.Do(func() { b.first <- struct{}{} })
	return b.ReadCloser.Read(p)
}

func TestGateway_StalledUploadWithoutDeadlineIs408(t *testing.T) {
	models := newFakeModels(t, "http://127.0.0.1:1")
	gw := New(Options{BodyTimeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}, models) // no request_timeout
	srv := serveGateway(t, gw.Handler(), nil)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":")
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response to a stalled upload without a deadline: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	wantError(t, resp, b, http.StatusRequestTimeout, "body_timeout")
	if n := len(models.admitted()); n != 0 {
		t.Errorf("Admit called for an incomplete body")
	}
}

// TestGateway_StalledStreamReaderIsCut: a client that stops reading its
// stream is cut after the write timeout, and its lease (Done) released.
func TestGateway_StalledStreamReaderIsCut(t *testing.T) {
	engineDone := make(chan struct{})
	chunk := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		defer close(engineDone)
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
	}, Options{WriteTimeout: 200 * time.Millisecond, RequestTimeout: time.Hour})
	d := net.Dialer{Control: nil}
	conn, err := d.DialContext(context.Background(), "tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := `{"model":"m1","stream":true}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Never read: the kernel buffers fill, then napd's writes block.
	select {
	case o := <-e.models.done:
		if !o.Cancelled {
			t.Errorf("stalled stream reported complete: %+v", o)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a client that stopped reading still holds its lease")
	}
	waitClosed(t, engineDone, "engine request cancelled")
}

// TestGateway_UnreadStreamCutAtDeadline: a client that stops reading its
// stream is cut at the request's deadline, long before the write timeout
// (a stream never read used to hold the model's slot until write_timeout
// ran out, well past request_timeout), and its lease released.
func TestGateway_UnreadStreamCutAtDeadline(t *testing.T) {
	engineDone := make(chan struct{})
	chunk := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		defer close(engineDone)
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
	}, Options{WriteTimeout: time.Hour, RequestTimeout: time.Second})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := `{"model":"m1","stream":true}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Never read: the kernel buffers fill, then napd's writes block. The
	// bound is far beyond the deadline and far short of the write timeout.
	select {
	case o := <-e.models.done:
		if !o.Cancelled {
			t.Errorf("unread stream reported complete: %+v", o)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a stream never read holds its lease past the request's deadline")
	}
	waitClosed(t, engineDone, "engine request cancelled")
}
