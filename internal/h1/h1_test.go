package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/internal/fakeclock"
)

// countingServer is an httptest server that counts the connections it
// accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// post is a request as the gateway hands it over: a body in memory.
func post(t testing.TB, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

func roundTrip(t *testing.T, tr http.RoundTripper, req *http.Request) (int, string) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Requests one after another share one connection; what the engine gets
// is the request as sent: method, path and query, headers, body.
func TestKeepAliveAndRequestAsSent(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s ua=%q len=%d %s", r.Method, r.URL.RequestURI(), r.Header.Get("X-Test"),
			r.Header.Values("User-Agent"), r.ContentLength, b)
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	for i := range 50 {
		req := post(t, context.Background(), srv.URL+"/v1/chat/completions?x=1", fmt.Sprintf(`{"n":%d}`, i))
		req.Header.Set("X-Test", "yes")
		req.Header.Set("User-Agent", "") // ReverseProxy: send none
		status, body := roundTrip(t, tr, req)
		want := fmt.Sprintf(`POST /v1/chat/completions?x=1 yes ua=[] len=%d {"n":%d}`, len(fmt.Sprintf(`{"n":%d}`, i)), i)
		if status != 200 || body != want {
			t.Fatalf("got %d %q, want %q", status, body, want)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/models", nil)
	if status, body := roundTrip(t, tr, req); status != 200 || body != `GET /v1/models  ua=[] len=0 ` {
		t.Fatalf("GET: %d %q", status, body)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for requests one after another, want 1", n)
	}
}

// A body larger than what goes out with the head is sent after it.
func TestLargeBody(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %x", len(b), b[len(b)-1])
	})
	tr := &Transport{}
	body := strings.Repeat("a", inline) + strings.Repeat("b", 3*inline)
	if status, got := roundTrip(t, tr, post(t, context.Background(), srv.URL, body)); status != 200 || got != fmt.Sprintf("%d 62", len(body)) {
		t.Fatalf("%d %q", status, got)
	}
}

// Concurrent requests each get their own connection and their own
// answer; no more connections stay than were used at once.
func TestConcurrent(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	tr := &Transport{}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				want := fmt.Sprintf(`{"g":%d,"i":%d}`, g, i)
				resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, want))
				if err != nil {
					t.Error(err)
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(b) != want {
					t.Errorf("got %q %v, want %q", b, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := conns.Load(); n > 16 {
		t.Errorf("%d connections for 16 concurrent clients", n)
	}
	tr.mu.Lock()
	idle := len(tr.idle)
	tr.mu.Unlock()
	if idle != int(conns.Load()) {
		t.Errorf("%d idle of %d connections after the requests", idle, conns.Load())
	}
}

// rawServer answers each request on each connection (numbered from 1)
// with what script returns, as an HTTP/1.1 server would: it closes the
// connection after an HTTP/1.0 answer, one saying "Connection: close",
// or when script says to hang up, and instead of an empty answer.
func rawServer(t *testing.T, script func(n int, req *http.Request) (answer string, hangUp bool)) (string, *atomic.Int32) {
	t.Helper()
	return rawServerConn(t, func(n int, req *http.Request, _ net.Conn) (string, bool) { return script(n, req) })
}

// rawServerConn is rawServer whose script also gets the connection, to
// write on it out of turn.
func rawServerConn(t *testing.T, script func(n int, req *http.Request, c net.Conn) (answer string, hangUp bool)) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(conns.Add(1))
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					ans, hangUp := script(n, req, c)
					if ans == "" {
						return
					}
					if _, err := io.WriteString(c, ans); err != nil || hangUp ||
						strings.HasPrefix(ans, "HTTP/1.0") || strings.Contains(ans, "Connection: close") {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), &conns
}

// Every way an answer can be delimited is read whole: chunked (with a
// trailer), Content-Length, the connection's close; interim 100s are
// skipped. Only a delimited answer without "Connection: close" leaves its
// connection for the next request.
func TestAnswerFraming(t *testing.T) {
	cases := []struct {
		name, answer, body string
		reused             bool
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "hello", true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\nX-T: 1\r\n\r\n", "hello", true},
		{"interim 100 first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", true},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", "", true},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", "ok", false},
		{"until close", "HTTP/1.0 200 OK\r\n\r\nto the end", "to the end", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url, conns := rawServer(t, func(int, *http.Request) (string, bool) { return c.answer, false })
			tr := &Transport{}
			for range 2 {
				status, body := roundTrip(t, tr, post(t, context.Background(), url, "{}"))
				if status/100 != 2 || body != c.body {
					t.Fatalf("%d %q, want %q", status, body, c.body)
				}
			}
			want := int32(2)
			if c.reused {
				want = 1
			}
			if n := conns.Load(); n != want {
				t.Errorf("%d connections for two requests, want %d", n, want)
			}
		})
	}
}

// An answer abandoned before its end closes its connection: the next
// request does not read the rest of it, and a read after the close fails
// rather than end it as if complete.
func TestBodyClosedEarly(t *testing.T) {
	url, conns := rawServer(t, func(_ int, r *http.Request) (string, bool) {
		if r.URL.Path == "/big" {
			return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	tr := &Transport{}
	resp, err := tr.RoundTrip(post(t, context.Background(), url+"/big", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // does not wait for the 90 bytes that never come
	if _, err := resp.Body.Read(buf); err == nil || err == io.EOF {
		t.Errorf("read after closing an unfinished answer: %v, want an error", err)
	}
	if status, body := roundTrip(t, tr, post(t, context.Background(), url, "{}")); status != 200 || body != "ok" {
		t.Fatalf("%d %q", status, body)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// A cancelled request ends within cancelSweep with its context's error,
// whether it waits for the answer's head or for the rest of its body; its
// connection is not reused.
func TestCancel(t *testing.T) {
	release := make(chan struct{})
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that net/http sees the client leave
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // before the server's Close
	tr := &Transport{}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(post(t, ctx, srv.URL, "{}"))
		done <- err
	}()
	waitConns(t, conns, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting for the head: %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL+"/stream", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) == "" {
		t.Fatalf("first chunk: %q %v", buf[:n], err)
	}
	go cancel()
	var rerr error
	for rerr == nil {
		_, rerr = resp.Body.Read(buf)
	}
	resp.Body.Close()
	if !errors.Is(rerr, context.Canceled) {
		t.Fatalf("reading the body: %v, want context.Canceled", rerr)
	}
	tr.mu.Lock()
	idle := len(tr.idle)
	tr.mu.Unlock()
	if idle != 0 {
		t.Errorf("%d connections kept after cancelled requests", idle)
	}
}

// A request cancelled after its whole answer came, before its body is
// closed, does not leave its connection for the next request (the sweep
// may be setting its deadline); requests done, the sweep stops.
func TestCancelledAtTheEndNotReused(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "okay")
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	if rest, err := io.ReadAll(resp.Body); string(rest) != "ay" || err != nil {
		t.Fatalf("the rest: %q %v", rest, err)
	}
	resp.Body.Close()
	if status, _ := roundTrip(t, tr, post(t, context.Background(), srv.URL, "{}")); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the cancelled request's was reused", n)
	}
	waitSweepStopped(t, tr)
}

// waitSweepStopped waits until tr's sweep has nothing left to look at and
// has stopped.
func waitSweepStopped(t *testing.T, tr *Transport) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		tr.mu.Lock()
		sweeping, flight := tr.sweeping, len(tr.flight)
		tr.mu.Unlock()
		if !sweeping && flight == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sweep still runs (%d requests in its list)", flight)
		}
	}
}

// A request a sweep finds still running is registered with its context
// and leaves the sweep's list, so the sweep stops while only such
// requests are open (10,000 streams cost it nothing); cancelled, the
// request still ends at once, and its connection is not reused.
func TestLongRequestRegisteredWithItsContext(t *testing.T) {
	release := make(chan struct{})
	got := make(chan struct{}, 2)
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that net/http sees the client leave
		got <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "okay")
	})
	t.Cleanup(func() { close(release) }) // before the server's Close
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(post(t, ctx, srv.URL, "{}"))
		done <- err
	}()
	<-got // written, so watched
	waitSweepStopped(t, tr)
	select {
	case err := <-done:
		t.Fatalf("the request ended before it was cancelled: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting for the head: %v, want context.Canceled", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() {
		_, err := tr.RoundTrip(post(t, ctx2, srv.URL, "{}"))
		done <- err
	}()
	<-got
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the cancelled request's was reused", n)
	}
}

func waitConns(t *testing.T, conns *atomic.Int32, n int32) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); conns.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections, waiting for %d", conns.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A connection the engine closed while it was idle is not used again, however
// short the idle: the request goes out on a new one instead of failing.
func TestIdleConnectionClosedByEngine(t *testing.T) {
	url, conns := rawServer(t, func(n int, _ *http.Request) (string, bool) {
		if n == 1 {
			// Answer, then hang up: as an engine whose keep-alive
			// timeout ran out.
			return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnew", false
	})
	tr := &Transport{}
	roundTrip(t, tr, post(t, context.Background(), url, "{}"))
	waitClosed(t, tr)
	if status, body := roundTrip(t, tr, post(t, context.Background(), url, "{}")); status != 200 || body != "new" {
		t.Fatalf("%d %q", status, body)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// waitClosed waits until the one idle connection is no longer open for
// reuse: closed by the engine, or with bytes nobody asked for.
func waitClosed(t *testing.T, tr *Transport) {
	t.Helper()
	tr.mu.Lock()
	c := tr.idle[0]
	tr.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); c.open(); {
		if time.Now().After(deadline) {
			t.Fatal("the idle connection still reads as open")
		}
		time.Sleep(time.Millisecond)
	}
}

// The check before each reuse of a connection allocates nothing: its
// RawConn and its peek are made once, with the connection.
func TestReuseCheckAllocatesNothing(t *testing.T) {
	url, _ := rawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	roundTrip(t, tr, post(t, context.Background(), url, "{}"))
	tr.mu.Lock()
	c := tr.idle[0]
	tr.mu.Unlock()
	if !c.open() {
		t.Fatal("an idle connection to a live engine reads as closed")
	}
	if n := testing.AllocsPerRun(100, func() { c.open() }); n != 0 {
		t.Errorf("%v allocations per check, want 0", n)
	}
}

// The engine not listening is a refused connection (the gateway hands
// such a request back to wait for the next engine instance).
func TestRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = (&Transport{}).RoundTrip(post(t, context.Background(), "http://"+addr, "{}"))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%v, want ECONNREFUSED", err)
	}
}

// The engine closing the connection before answering is an error, not an
// empty answer.
func TestClosedBeforeAnswer(t *testing.T) {
	url, _ := rawServer(t, func(int, *http.Request) (string, bool) { return "", false })
	_, err := (&Transport{}).RoundTrip(post(t, context.Background(), url, "{}"))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("%v, want unexpected EOF", err)
	}
}

type recordingRT struct{ n atomic.Int32 }

func (r *recordingRT) RoundTrip(*http.Request) (*http.Response, error) {
	r.n.Add(1)
	return &http.Response{StatusCode: 299, Body: http.NoBody}, nil
}

// What this transport does not carry goes to the fallback: a body
// streaming in (no GetBody, or unknown length), an upgrade.
func TestFallback(t *testing.T) {
	fb := &recordingRT{}
	tr := &Transport{Fallback: fb}
	streamed, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", io.NopCloser(strings.NewReader("x")))
	streamed.ContentLength = -1
	upgrade, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/", nil)
	upgrade.Header.Set("Upgrade", "websocket")
	for _, req := range []*http.Request{streamed, upgrade} {
		if resp, err := tr.RoundTrip(req); err != nil || resp.StatusCode != 299 {
			t.Fatalf("%v %v", resp, err)
		}
	}
	if fb.n.Load() != 2 {
		t.Errorf("fallback carried %d of 2", fb.n.Load())
	}
}

// A header that would split the request is refused, not sent.
func TestBadHeader(t *testing.T) {
	for _, h := range [][2]string{{"X-A", "a\r\nX-Injected: 1"}, {"Bad Name", "v"}, {"X-B", "a\x00"}} {
		req := post(t, context.Background(), "http://127.0.0.1:1/", "{}")
		req.Header[h[0]] = []string{h[1]}
		if _, err := appendHead(nil, req); err == nil {
			t.Errorf("header %q: %q accepted", h[0], h[1])
		}
	}
}

// FuzzAppendHead: whatever the header, the head written either is
// refused or parses back as the same request.
func FuzzAppendHead(f *testing.F) {
	f.Add("X-Test", "value", "/v1/chat/completions", "a=1")
	f.Add("Content-Type", "application/json; charset=utf-8", "/v1/completions", "")
	f.Add("X-A", "a\r\nX-B: b", "/", "")
	f.Fuzz(func(t *testing.T, name, value, path, query string) {
		req, err := http.NewRequest(http.MethodPost, "http://engine:8000/", bytes.NewReader([]byte("{}")))
		if err != nil {
			t.Skip()
		}
		req.URL.Path, req.URL.RawQuery = "/"+strings.TrimLeft(path, "/"), query
		req.Header[http.CanonicalHeaderKey(name)] = []string{value}
		head, err := appendHead(nil, req)
		if err != nil {
			return
		}
		got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(append(head, "{}"...))))
		if err != nil {
			if strings.TrimSpace(value) != value || strings.ContainsAny(value+req.URL.RequestURI(), "\x7f") {
				return // net/http's reader is stricter about whitespace and controls
			}
			t.Fatalf("head %q does not parse: %v", head, err)
		}
		if got.RequestURI != req.URL.RequestURI() || got.Host != "engine:8000" || got.ContentLength != 2 {
			t.Fatalf("head %q parsed as %s %s %d", head, got.RequestURI, got.Host, got.ContentLength)
		}
		k := http.CanonicalHeaderKey(name)
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Trailer", "User-Agent":
			return
		}
		// The reader trims ASCII white space only (a no-break space stays).
		if v := got.Header.Get(k); v != textproto.TrimString(value) {
			t.Fatalf("header %q = %q, sent %q", k, v, value)
		}
	})
}

// Once the engine's instance is retired, a request ending closes its
// connection instead of keeping it idle.
func TestRetiredKeepsNothing(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	var retired atomic.Bool
	tr := &Transport{Retired: retired.Load}
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "{}"))
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "{}"))
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections before the retirement, want 1", n)
	}
	retired.Store(true)
	roundTrip(t, tr, post(t, context.Background(), srv.URL, "{}"))
	tr.mu.Lock()
	idle := len(tr.idle)
	tr.mu.Unlock()
	if idle != 0 {
		t.Errorf("%d connections kept idle to a retired engine", idle)
	}
}

// An engine's answer head is bounded: one that never ends its headers, or
// sends interim answers without end, fails its request instead of growing
// napd's memory or holding it forever. Five interim answers are allowed,
// as net/http's Transport allows.
func TestAnswerHeadBounded(t *testing.T) {
	huge := "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("a", 1000)+"\r\n", maxHead/1000+1) + "\r\n"
	interim := func(n int) string {
		return strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", n) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	}
	for _, c := range []struct {
		name, answer string
		want         error
	}{
		{"head over the bound", huge, errHeadTooLarge},
		{"six interim answers", interim(6), errInterim},
		{"five interim answers", interim(5), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			url, _ := rawServer(t, func(int, *http.Request) (string, bool) { return c.answer, false })
			resp, err := (&Transport{}).RoundTrip(post(t, context.Background(), url, "{}"))
			if c.want != nil {
				if !errors.Is(err, c.want) {
					t.Fatalf("%v, want %v", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "ok" {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
		})
	}
}

// A connection idle past IdleTimeout is closed even while requests keep
// coming: reuse takes the most recent connection first, so the ones a
// burst left below it would otherwise never be looked at again, and stay
// open (in CLOSE_WAIT, once the engine closed its end) for good.
func TestIdleTimeoutUnderSteadyLoad(t *testing.T) {
	url, _ := rawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	clock := fakeclock.New(time.Unix(1000, 0))
	tr := &Transport{clock: clock.Now, IdleTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	// A burst of two: two connections, both put back idle now.
	first, err := tr.RoundTrip(post(t, context.Background(), url, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, tr, post(t, context.Background(), url, "{}"))
	_, _ = io.ReadAll(first.Body)
	first.Body.Close()
	tr.mu.Lock()
	oldest := tr.idle[0]
	tr.mu.Unlock()
	// Then one request at a time, each reusing the most recent one, until
	// the other has been idle past the timeout.
	clock.Advance(time.Minute - time.Millisecond)
	roundTrip(t, tr, post(t, context.Background(), url, "{}"))
	clock.Advance(2 * time.Millisecond)
	roundTrip(t, tr, post(t, context.Background(), url, "{}"))
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, c := range tr.idle {
		if c == oldest {
			t.Fatalf("a connection idle for %v is still kept (IdleTimeout %v)", time.Minute+time.Millisecond, tr.IdleTimeout)
		}
	}
	if len(tr.idle) != 1 {
		t.Errorf("%d idle connections, want 1", len(tr.idle))
	}
}

// An answer cut short fails every read after the first failed one too, as
// net/http's body does: a reader that reads again must not see its end.
func TestCutAnswerStaysFailed(t *testing.T) {
	url, _ := rawServer(t, func(int, *http.Request) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789", true
	})
	resp, err := (&Transport{}).RoundTrip(post(t, context.Background(), url, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) || string(b) != "0123456789" {
		t.Fatalf("%q %v, want the 10 bytes sent and unexpected EOF", b, err)
	}
	if _, err := resp.Body.Read(make([]byte, 8)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read again after the cut: %v, want unexpected EOF", err)
	}
}

// No request this transport carries asks to switch protocols (upgrades go
// to the fallback), so an engine's 101 is an error, and its connection is
// closed: ReverseProxy would refuse the answer without closing its body,
// leaving the connection open.
func TestUnaskedSwitchingProtocols(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			closed <- err
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			closed <- err
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n")
		_, err = br.ReadByte() // what napd does with the connection next
		closed <- err
	}()
	resp, err := (&Transport{}).RoundTrip(post(t, context.Background(), "http://"+ln.Addr().String(), "{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a 101 to a request that asked no upgrade was taken as its answer")
	}
	select {
	case err := <-closed:
		if err != io.EOF {
			t.Errorf("the engine's end read %v, want EOF (closed)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connection stayed open")
	}
}

// A request cancelled while its body is still going out (the engine does
// not read it) or while its connection is being made ends soon with
// its context's error, and keeps nothing open.
func TestCancelWhileSendingOrDialing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c // never read: the request's body fills the buffers
		}
	}()
	tr := &Transport{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(post(t, ctx, "http://"+ln.Addr().String(), strings.Repeat("x", 64<<20)))
		done <- err
	}()
	c := <-accepted
	defer c.Close()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while sending: %v, want context.Canceled", err)
	}
	// napd's end is closed: the engine reads the bytes sent, then EOF.
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the engine's end: %v, want EOF", err)
	}

	dialing := make(chan struct{})
	tr = &Transport{Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		close(dialing)
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		_, err := tr.RoundTrip(post(t, ctx, "http://127.0.0.1:1/", "{}"))
		done <- err
	}()
	<-dialing
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while dialing: %v, want context.Canceled", err)
	}
}

// Bytes an engine sends after its answer ended, unasked, are never read as
// the next request's answer (they could be another client's): the
// connection is dropped at its next reuse, however soon.
func TestUnsolicitedBytesNotReadAsTheNextAnswer(t *testing.T) {
	stray := make(chan struct{})
	url, conns := rawServerConn(t, func(n int, _ *http.Request, c net.Conn) (string, bool) {
		if n > 1 {
			return "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh", false
		}
		go func() {
			<-stray // once the client has the whole answer
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nevil!")
		}()
		return "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", false
	})
	tr := &Transport{}
	if _, body := roundTrip(t, tr, post(t, context.Background(), url, "{}")); body != "first" {
		t.Fatalf("first answer %q", body)
	}
	close(stray)
	waitClosed(t, tr) // the stray bytes are there
	if _, body := roundTrip(t, tr, post(t, context.Background(), url, "{}")); body != "fresh" {
		t.Fatalf("second request answered %q, want its own answer on a new connection", body)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

// The request's body is closed once sent, as the RoundTripper contract asks.
func TestRequestBodyClosed(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	req := post(t, context.Background(), srv.URL, "{}")
	body := &closeRecorder{Reader: strings.NewReader("{}")}
	req.Body = body
	roundTrip(t, &Transport{}, req)
	if !body.closed.Load() {
		t.Error("the request body was not closed")
	}
}

// refusingWrites is a connection whose writes fail, writing nothing, once
// its first request is written.
type refusingWrites struct {
	net.Conn
	writes int
}

func (c *refusingWrites) Write(b []byte) (int, error) {
	if c.writes++; c.writes > 1 {
		return 0, syscall.EPIPE
	}
	return c.Conn.Write(b)
}

// A MemBody is carried by the Transport itself, without GetBody, and a
// request that could not be written on a reused connection goes again on
// a new one with its body rewound.
func TestMemBodyRewoundForRetry(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	tr := &Transport{
		Fallback: &recordingRT{},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			return &refusingWrites{Conn: nc}, err
		},
	}
	defer tr.CloseIdleConnections()
	for i := range 2 {
		body := fmt.Sprintf(`{"n":%d}`, i)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
		mb := &MemBody{}
		mb.Reset([]byte(body))
		req.Body, req.ContentLength = mb, int64(len(body))
		if status, got := roundTrip(t, tr, req); status != 200 || got != body {
			t.Fatalf("request %d: %d %q, want %q", i, status, got, body)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}
