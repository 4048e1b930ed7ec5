package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serverName says which server runs a handler: this package's, or the
// net/http Fallback it hands connections to.
func serverName(w http.ResponseWriter) string {
	if _, ok := w.(*response); ok {
		return "h1"
	}
	return "net/http"
}

// testServer is a Server on a loopback port whose Fallback serves the
// same handler.
type testServer struct {
	*Server
	addr string
	done chan struct{} // closed when Serve returned
	err  error         // what Serve returned
}

func startServer(t *testing.T, h http.HandlerFunc, configure ...func(*Server)) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Handler: h, Fallback: &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}}
	for _, f := range configure {
		f(s)
	}
	ts := &testServer{Server: s, addr: ln.Addr().String(), done: make(chan struct{})}
	go func() {
		ts.err = s.Serve(ln)
		close(ts.done)
	}()
	t.Cleanup(func() {
		_ = s.Close()
		<-ts.done
		// The sweep reads watchAfter, which tests change: it must end
		// with its server's test.
		waitFor(t, "the sweep to end", func() bool { return !s.sweeping.Load() })
	})
	return ts
}

// waitFor polls cond until it holds, for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// setWatchAfter shortens the wait before a running request is watched,
// for one test.
func setWatchAfter(t *testing.T, d time.Duration) {
	old := watchAfter
	watchAfter = d
	t.Cleanup(func() { watchAfter = old })
}

// connState reports whether the server's end of client's connection
// satisfies cond, checked under the locks the server's own goroutines
// take.
func connState(s *Server, client *rawClient, cond func(c *serverConn) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.raddr == client.nc.LocalAddr().String() {
			c.mu.Lock()
			defer c.mu.Unlock()
			return cond(c)
		}
	}
	return false
}

// rawClient speaks HTTP/1.1 on one connection, byte for byte.
type rawClient struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialServer(t *testing.T, addr string) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	// No test waits longer for the server.
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawClient{t: t, nc: nc, br: bufio.NewReader(nc)}
}

func (c *rawClient) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.nc, s); err != nil {
		c.t.Fatal(err)
	}
}

// answer reads one answer to a request of method, body included.
func (c *rawClient) answer(method string) (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("reading the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading the body: %v", err)
	}
	return resp, string(b)
}

// closedByServer asserts that the server closes the connection without
// sending anything more.
func (c *rawClient) closedByServer() {
	c.t.Helper()
	b, err := io.ReadAll(c.br)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		c.t.Fatalf("%v, want the connection closed by the server", err)
	}
	if len(b) > 0 {
		c.t.Fatalf("%q sent before the close", b)
	}
}

func get(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n" }

// Requests one after another, and two written at once, are served on one
// connection, each answer in its request's order.
func TestServerKeepAlive(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", serverName(w), r.URL.Path)
	})
	c := dialServer(t, ts.addr)
	for i := range 3 {
		c.send(get(fmt.Sprintf("/%d", i)))
		if _, body := c.answer("GET"); body != fmt.Sprintf("h1 /%d", i) {
			t.Fatalf("request %d answered %q", i, body)
		}
	}
	// A CRLF after a POST's body, which old clients send, is skipped.
	c.send("POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi\r\n" + get("/after"))
	for _, want := range []string{"h1 /post", "h1 /after"} {
		if _, body := c.answer("GET"); body != want {
			t.Fatalf("%q, want %q", body, want)
		}
	}
	c.send(get("/a") + get("/b"))
	for _, want := range []string{"h1 /a", "h1 /b"} {
		if _, body := c.answer("GET"); body != want {
			t.Fatalf("pipelined: %q, want %q", body, want)
		}
	}
}

// How an answer is delimited: a small one gets a Content-Length, a large
// or flushed one goes chunked, a handler's Content-Length is kept; HEAD,
// 204 and 304 have no body. Each answer is followed by another on the same
// connection, so that a byte too many or too few shows.
func TestServerAnswerFraming(t *testing.T) {
	large := strings.Repeat("0123456789", 300)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small":
			_, _ = io.WriteString(w, "hello")
		case "/large":
			for i := 0; i < len(large); i += 1000 {
				_, _ = io.WriteString(w, large[i:i+1000])
			}
		case "/flushed":
			_, _ = io.WriteString(w, "hel")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "lo")
		case "/length":
			w.Header().Set("Content-Length", "5")
			_, _ = io.WriteString(w, "hel")
			_, _ = io.WriteString(w, "lo")
		case "/large-length":
			w.Header().Set("Content-Length", fmt.Sprint(len(large)))
			_, _ = io.WriteString(w, large)
		case "/empty":
		case "/204", "/304":
			code := http.StatusNoContent
			if r.URL.Path == "/304" {
				code = http.StatusNotModified
			}
			w.Header().Set("Content-Length", "5")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(code)
			if _, err := io.WriteString(w, "hello"); !errors.Is(err, http.ErrBodyNotAllowed) {
				panic(fmt.Sprintf("a body written to a %d: %v", code, err))
			}
		}
	})
	c := dialServer(t, ts.addr)
	for _, tc := range []struct {
		path, body string
		chunked    bool
		length     string // the Content-Length header; "" for none
	}{
		{"/small", "hello", false, "5"},
		{"/large", large, true, ""},
		{"/flushed", "hello", true, ""},
		{"/length", "hello", false, "5"},
		{"/large-length", large, false, fmt.Sprint(len(large))},
		{"/empty", "", false, "0"},
	} {
		c.send(get(tc.path))
		resp, body := c.answer("GET")
		if resp.StatusCode != 200 || body != tc.body {
			t.Fatalf("%s: %d %q, want %q", tc.path, resp.StatusCode, body, tc.body)
		}
		if chunked := slices.Equal(resp.TransferEncoding, []string{"chunked"}); chunked != tc.chunked {
			t.Errorf("%s: Transfer-Encoding %q, want chunked %v", tc.path, resp.TransferEncoding, tc.chunked)
		}
		if got := resp.Header.Get("Content-Length"); got != tc.length {
			t.Errorf("%s: Content-Length %q, want %q", tc.path, got, tc.length)
		}
		if _, err := http.ParseTime(resp.Header.Get("Date")); err != nil {
			t.Errorf("%s: Date %q: %v", tc.path, resp.Header.Get("Date"), err)
		}
	}
	// HEAD: the head of a GET (as net/http has it), without its body.
	for _, tc := range []struct{ path, length, contentType string }{
		{"/small", "5", "text/plain; charset=utf-8"},
		{"/large", "", "text/plain; charset=utf-8"},
		{"/flushed", "", "text/plain; charset=utf-8"},
		{"/length", "5", "text/plain; charset=utf-8"},
		{"/empty", "", ""},
	} {
		c.send("HEAD " + tc.path + " HTTP/1.1\r\nHost: x\r\n\r\n" + get("/small"))
		resp, body := c.answer("HEAD")
		if resp.StatusCode != 200 || body != "" || resp.TransferEncoding != nil ||
			resp.Header.Get("Content-Length") != tc.length || resp.Header.Get("Content-Type") != tc.contentType {
			t.Fatalf("HEAD %s: %d %q %q %v, want Content-Length %q, Content-Type %q", tc.path,
				resp.StatusCode, body, resp.TransferEncoding, resp.Header, tc.length, tc.contentType)
		}
		if _, body := c.answer("GET"); body != "hello" {
			t.Fatalf("GET after HEAD %s: %q", tc.path, body)
		}
	}
	for _, code := range []int{204, 304} {
		c.send(get(fmt.Sprintf("/%d", code)) + get("/small"))
		resp, body := c.answer("GET")
		if resp.StatusCode != code || body != "" || resp.Header["Content-Length"] != nil || resp.TransferEncoding != nil {
			t.Fatalf("%d: %d %q %v %q", code, resp.StatusCode, body, resp.Header, resp.TransferEncoding)
		}
		// A 304 describes no content: no Content-Type either, as from
		// net/http.
		if ct := resp.Header["Content-Type"]; (code == 304) != (ct == nil) {
			t.Errorf("%d: Content-Type %q", code, ct)
		}
		if _, body := c.answer("GET"); body != "hello" {
			t.Fatalf("GET after %d: %q", code, body)
		}
	}
}

// A Content-Length the handler sets after WriteHeader is not the
// answer's (net/http ignores it too): the server frames the answer, with
// one Content-Length or chunked, never both.
func TestServerLengthAfterWriteHeader(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.Header().Set("Content-Length", "7")
		n := 5
		if r.URL.Path == "/large" {
			n = 3000
		}
		_, _ = io.WriteString(w, strings.Repeat("a", n))
	})
	for _, tc := range []struct{ path, length, te string }{
		{"/small", "5", ""},
		{"/large", "", "chunked"},
	} {
		c := dialServer(t, ts.addr)
		c.send(get(tc.path))
		tp := textproto.NewReader(c.br)
		if _, err := tp.ReadLine(); err != nil {
			t.Fatal(err)
		}
		h, err := tp.ReadMIMEHeader()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(h["Content-Length"], nonEmpty(tc.length)) || !slices.Equal(h["Transfer-Encoding"], nonEmpty(tc.te)) {
			t.Errorf("%s: Content-Length %q, Transfer-Encoding %q; want %q, %q", tc.path,
				h["Content-Length"], h["Transfer-Encoding"], tc.length, tc.te)
		}
	}
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// Answers as net/http's: for each way a handler answers, and each kind of
// request, the same status, header, framing, body and trailers, Date
// aside. Where they differ on purpose, it is said below.
func TestServerAnswersAsNetHTTP(t *testing.T) {
	handlers := map[string]http.HandlerFunc{
		"/small": func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") },
		"/large": func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, strings.Repeat("a", 3000)) },
		"/flushed": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "he")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "llo")
		},
		"/flushed-empty": func(w http.ResponseWriter, r *http.Request) { w.(http.Flusher).Flush() },
		"/length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "5")
			_, _ = io.WriteString(w, "hello")
		},
		"/length-unwritten": func(w http.ResponseWriter, r *http.Request) { w.Header().Set("Content-Length", "5") },
		"/length-late": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Header().Set("Content-Length", "7")
			_, _ = io.WriteString(w, "hello")
		},
		"/204": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/x")
			w.WriteHeader(http.StatusNoContent)
		},
		"/304": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/x")
			w.Header().Set("Etag", `"x"`)
			w.WriteHeader(http.StatusNotModified)
		},
		"/trailer": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum")
			_, _ = io.WriteString(w, "hello")
			w.Header().Set("X-Sum", "1")
		},
		"/no-type": func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = nil
			_, _ = io.WriteString(w, "hello")
		},
		"/encoded": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = io.WriteString(w, "hello")
		},
		"/close": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, "hello")
		},
		"/keep-alive": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "keep-alive")
			_, _ = io.WriteString(w, "hello")
		},
		"/error": func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bad", http.StatusInternalServerError) },
		"/empty": func(w http.ResponseWriter, r *http.Request) {},
		"/201":   func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) },
		"/599": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(599)
			_, _ = io.WriteString(w, "x")
		},
		"/103": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			_, _ = io.WriteString(w, "ok")
		},
		"/bad-header": func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Bad Name"] = []string{"x"}
			w.Header()["X-Split"] = []string{"a\r\nX-Injected: 1"}
			_, _ = io.WriteString(w, "hello")
		},
		"/echo": func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			_, _ = w.Write(b)
		},
		// Not compared, the differences being on purpose:
		// - a Transfer-Encoding the handler sets: net/http keeps it,
		//   this server frames the answer itself;
		// - a trailer set with TrailerPrefix after a small body, not
		//   flushed: net/http drops it (the answer goes with a
		//   Content-Length), this server sends it, chunked;
		// - a declared trailer already set when the head goes: net/http
		//   also sends it in the head, this server only as a trailer.
	}
	h := func(w http.ResponseWriter, r *http.Request) { handlers[r.URL.Path](w, r) }
	ours := startServer(t, h)
	theirs := httptest.NewServer(http.HandlerFunc(h))
	defer theirs.Close()
	// answers reads what addr answers to request, 1xx answers included.
	answers := func(addr, method, request string) string {
		c := dialServer(t, addr)
		c.send(request)
		var out []string
		for {
			resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
			if err != nil {
				return strings.Join(append(out, err.Error()), " | ")
			}
			b, err := io.ReadAll(resp.Body)
			resp.Header.Del("Date")
			out = append(out, fmt.Sprintf("%d %q %v length=%d %q close=%v %v trailer=%v",
				resp.StatusCode, b, err, resp.ContentLength, resp.TransferEncoding, resp.Close, resp.Header, resp.Trailer))
			if resp.StatusCode >= 200 {
				return strings.Join(out, " | ")
			}
		}
	}
	for path := range handlers {
		for _, request := range []string{
			"GET %s HTTP/1.1\r\nHost: x\r\n\r\n",
			"HEAD %s HTTP/1.1\r\nHost: x\r\n\r\n",
			"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
			"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		} {
			request = fmt.Sprintf(request, path)
			method, _, _ := strings.Cut(request, " ")
			got, want := answers(ours.addr, method, request), answers(theirs.Listener.Addr().String(), method, request)
			if got != want {
				t.Errorf("%q:\n  answered %s\n  net/http %s", request, got, want)
			}
		}
	}
}

// A request reaches the handler as through net/http's server (or is
// refused alike), however its head is written.
func TestServerRequestsAsNetHTTP(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %q %q %q %v %d %v %q %v %s", r.Method, r.URL, r.RequestURI, r.Host, r.Header, r.ContentLength, r.Close, b, err, r.Proto)
	}
	ours := startServer(t, h)
	theirs := httptest.NewServer(http.HandlerFunc(h))
	defer theirs.Close()
	for _, request := range []string{
		"GET /a?b=c HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a\xff HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET //a HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/../b;c HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /%2F HTTP/1.1\r\nHost: x\r\n\r\n",
		"get /a HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x:80\r\nX: \xff\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: \r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: [::1]:8\r\n\r\n",
		"GET /a HTTP/1.1\r\nhost: x\r\nx-a: 1\r\nX-A: 2\r\nX_Under: 3\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
		"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 002\r\n\r\nhi",
		"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length:  2 \r\n\r\nhi",
		"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTrailer: X\r\n\r\nhi",
		"GET /a HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close, te\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\nCache-Control: max-age=0\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nX-Empty:\r\nX-Spaces:   \r\nX-Tab: a\tb\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nX-Ctl: a\x01b\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nX-Del: a\x7fb\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nx-\xfc: 1\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\n:bad\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n",
	} {
		var got [2]string
		for i, addr := range []string{ours.addr, theirs.Listener.Addr().String()} {
			c := dialServer(t, addr)
			c.send(request)
			resp, err := http.ReadResponse(c.br, nil)
			if err != nil {
				got[i] = err.Error()
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			got[i] = fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		if got[0] != got[1] {
			t.Errorf("%q:\n  handler got %s\n  net/http's  %s", request, got[0], got[1])
		}
	}
}

// An answer shorter than its Content-Length is cut: the connection is
// closed after it, so the client sees it short instead of waiting.
func TestServerShortAnswer(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		_, _ = io.WriteString(w, "hello")
	})
	c := dialServer(t, ts.addr)
	c.send(get("/"))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) || string(b) != "hello" {
		t.Fatalf("%q %v, want hello and unexpected EOF", b, err)
	}
}

// Content-Type is sniffed from the body when the handler set none, and
// left out when the handler set the key (even to nothing).
func TestServerContentType(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/html":
			_, _ = io.WriteString(w, "<!DOCTYPE html><html><body>hi")
		case "/none":
			w.Header()["Content-Type"] = nil
			_, _ = io.WriteString(w, "hello")
		case "/set":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "hello")
		case "/large":
			_, _ = io.WriteString(w, strings.Repeat("a", 3000))
		default:
			_, _ = io.WriteString(w, "hello")
		}
	})
	c := dialServer(t, ts.addr)
	for path, want := range map[string][]string{
		"/text":  {"text/plain; charset=utf-8"},
		"/large": {"text/plain; charset=utf-8"},
		"/html":  {"text/html; charset=utf-8"},
		"/set":   {"application/json"},
		"/none":  nil,
	} {
		c.send(get(path))
		if resp, _ := c.answer("GET"); !slices.Equal(resp.Header["Content-Type"], want) {
			t.Errorf("%s: Content-Type %q, want %q", path, resp.Header["Content-Type"], want)
		}
	}
}

// A handler may hand its answer a header of its own, if it has not asked
// for the answer's (Header) nor written the head: the header is then the
// answer's.
func TestServerTakeHeader(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		h := http.Header{"X-A": {"1"}, "Content-Type": {"application/json"}}
		switch r.URL.Path {
		case "/asked":
			w.Header().Set("X-Own", "yes")
		case "/written":
			w.WriteHeader(http.StatusAccepted)
		}
		taken := w.(*response).TakeHeader(h)
		w.Header().Add("X-Taken", strconv.FormatBool(taken))
		_, _ = io.WriteString(w, "{}")
	})
	c := dialServer(t, ts.addr)
	for _, path := range []string{"/take", "/asked", "/written"} {
		c.send(get(path))
		resp, body := c.answer("GET")
		taken := path == "/take"
		if body != "{}" || (resp.Header.Get("X-A") == "1") != taken || (resp.Header.Get("Content-Type") == "application/json") != taken {
			t.Errorf("%s: header %v body %q", path, resp.Header, body)
		}
		if path != "/written" && resp.Header.Get("X-Taken") != strconv.FormatBool(taken) {
			t.Errorf("%s: X-Taken %q", path, resp.Header.Get("X-Taken"))
		}
	}
}

// A 1xx answer goes out at once, with the handler's header but no
// Content-Length; the final answer follows.
func TestServerInterim(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.Header().Set("Content-Length", "2")
		w.WriteHeader(http.StatusEarlyHints)
		_, _ = io.WriteString(w, "ok")
	})
	c := dialServer(t, ts.addr)
	c.send(get("/"))
	early, _ := c.answer("GET")
	if early.StatusCode != 103 || early.Header.Get("Link") != "</a.css>; rel=preload" || early.Header["Content-Length"] != nil {
		t.Fatalf("interim: %d %v", early.StatusCode, early.Header)
	}
	if resp, body := c.answer("GET"); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("final: %d %q", resp.StatusCode, body)
	}
}

// Trailers, declared with a Trailer header or set with TrailerPrefix,
// arrive as the chunked answer's trailers, whatever the body's size: an
// answer with trailers goes chunked, as net/http's does.
func TestServerTrailers(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		body := "hello"
		if r.URL.Query().Has("large") {
			body = strings.Repeat("a", 3000)
		}
		if r.URL.Path == "/declared" {
			w.Header().Set("Trailer", "X-Sum")
		}
		_, _ = io.WriteString(w, body)
		if r.URL.Path == "/declared" {
			w.Header().Set("X-Sum", "42")
		} else {
			w.Header().Set(http.TrailerPrefix+"X-Sum", "42")
		}
	})
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, path := range []string{"/declared", "/declared?large", "/prefixed", "/prefixed?large"} {
		resp, err := client.Get("http://" + ts.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %d bytes, %v", path, len(b), err)
		}
		if got := resp.Trailer.Get("X-Sum"); got != "42" {
			t.Errorf("%s: trailer X-Sum %q, want 42 (trailers %v, header %v)", path, got, resp.Trailer, resp.Header)
		}
	}
}

// The connection is closed after the answer, which says so, when the
// request asks it, when the handler does, or with keep-alives disabled.
func TestServerConnectionClose(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		_, _ = io.WriteString(w, "ok")
	}
	for _, tc := range []struct {
		name, request string
		disable       bool
	}{
		{"request", "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", false},
		{"handler", get("/close"), false},
		{"DisableKeepAlives", get("/"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, h, func(s *Server) { s.DisableKeepAlives = tc.disable })
			c := dialServer(t, ts.addr)
			c.send(tc.request)
			resp, body := c.answer("GET")
			// resp.Close: the answer said "Connection: close".
			if body != "ok" || !resp.Close {
				t.Fatalf("%q close=%v %v", body, resp.Close, resp.Header)
			}
			c.closedByServer()
		})
	}
}

// When the request asks for the close, the answer says close even where
// the handler said keep-alive, as net/http's does.
func TestServerConnectionCloseOverridesHandler(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "keep-alive")
		_, _ = io.WriteString(w, "ok")
	})
	c := dialServer(t, ts.addr)
	c.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if resp, _ := c.answer("GET"); !resp.Close {
		t.Fatalf("Connection %q, want close", resp.Header["Connection"])
	}
	c.closedByServer()
}

// IdleTimeout closes a connection idle between requests; ReadHeaderTimeout
// one whose head stalls.
func TestServerTimeouts(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }
	t.Run("idle", func(t *testing.T) {
		ts := startServer(t, h, func(s *Server) { s.IdleTimeout = 20 * time.Millisecond })
		c := dialServer(t, ts.addr)
		c.send(get("/"))
		c.answer("GET")
		c.closedByServer()
	})
	t.Run("first request", func(t *testing.T) {
		// Not idle yet: as net/http, the ReadHeaderTimeout bounds the
		// wait, not the IdleTimeout.
		ts := startServer(t, h, func(s *Server) { s.ReadHeaderTimeout, s.IdleTimeout = 20*time.Millisecond, time.Hour })
		dialServer(t, ts.addr).closedByServer()
	})
	t.Run("head", func(t *testing.T) {
		ts := startServer(t, h, func(s *Server) { s.ReadHeaderTimeout = 20 * time.Millisecond })
		c := dialServer(t, ts.addr)
		c.send("GET / HTTP/1.1\r\nHost: x\r\n")
		c.closedByServer()
	})
	t.Run("idle since the last request", func(t *testing.T) {
		// The idle wait is counted from the last request, not from an
		// earlier one whose deadline was in place (see deadline.put).
		const idle = 200 * time.Millisecond
		ts := startServer(t, h, func(s *Server) { s.IdleTimeout = idle })
		c := dialServer(t, ts.addr)
		c.send(get("/"))
		c.answer("GET")
		time.Sleep(idle / 2)
		last := time.Now()
		c.send(get("/"))
		c.answer("GET")
		c.closedByServer()
		if idled := time.Since(last); idled < idle {
			t.Fatalf("closed after %v idle, want %v", idled, idle)
		}
	})
	t.Run("head after an idle wait", func(t *testing.T) {
		// The head's first bytes end the idle wait; the rest must come
		// within the ReadHeaderTimeout.
		ts := startServer(t, h, func(s *Server) { s.ReadHeaderTimeout, s.IdleTimeout = 20*time.Millisecond, time.Hour })
		c := dialServer(t, ts.addr)
		c.send(get("/"))
		c.answer("GET")
		c.send("GET / HTTP/1.1\r\nHost: x\r\n")
		c.closedByServer()
	})
}

// With an IdleTimeout and no ReadHeaderTimeout, a head that began within
// the IdleTimeout is read however long it takes, as net/http does: the
// idle wait's deadline does not also bound the head.
func TestServerIdleTimeoutEndsWithFirstByte(t *testing.T) {
	const idle = 50 * time.Millisecond
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") },
		func(s *Server) { s.IdleTimeout = idle })
	c := dialServer(t, ts.addr)
	c.send("GET / HT")
	time.Sleep(3 * idle) // past the idle wait's deadline
	c.send("TP/1.1\r\nHost: x\r\n\r\n")
	if _, body := c.answer("GET"); body != "ok" {
		t.Fatalf("%q", body)
	}
}

// Nor, once the head came whole, does it bound the body: the handler
// reads it however long it takes.
func TestServerIdleTimeoutSparesBody(t *testing.T) {
	const idle = 50 * time.Millisecond
	started := make(chan struct{})
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %v", b, err)
	}, func(s *Server) { s.IdleTimeout = idle })
	c := dialServer(t, ts.addr)
	c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
	<-started
	time.Sleep(3 * idle) // past the idle wait's deadline
	c.send("cd")
	if _, body := c.answer("POST"); body != "abcd <nil>" {
		t.Fatalf("%q", body)
	}
}

// A deadline a handler sets bounds the body's reads, also one already
// waiting, and the answer's writes.
func TestServerHandlerDeadlines(t *testing.T) {
	errs := make(chan error, 2)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		read := make(chan error, 1)
		reading := make(chan struct{})
		go func() {
			close(reading)
			_, err := io.ReadAll(r.Body)
			read <- err
		}()
		<-reading
		// Most likely waiting for the body's rest by then; the deadline
		// ends the read either way.
		time.Sleep(10 * time.Millisecond)
		_ = rc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		errs <- <-read
		_ = rc.SetWriteDeadline(time.Unix(1, 0))
		_, _ = w.Write(make([]byte, 1<<20))
		errs <- rc.Flush()
	})
	c := dialServer(t, ts.addr)
	c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
	for _, what := range []string{"read", "write"} {
		select {
		case err := <-errs:
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("%s: %v, want the deadline's error", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still waiting", what)
		}
	}
}

// Every request this server does not serve itself goes to the Fallback,
// with the bytes already read; net/http answers what it refuses.
func TestServerHandOff(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			hijackEcho(w)
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", serverName(w), r.Host, b)
	})
	pad := strings.Repeat("a", 5000)
	for _, tc := range []struct {
		name, request string
		status        int
		body          string
	}{
		{"chunked upload", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n", 200, "net/http x hello"},
		{"head over 4 KiB", "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + pad + "\r\n\r\n", 200, "net/http x "},
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: x\r\n\r\n", 200, "net/http x "},
		{"absolute target", "GET http://y/ HTTP/1.1\r\nHost: x\r\n\r\n", 200, "net/http y "},
		{"obsolete line folding", "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 200, "net/http x "},
		{"bare line feeds", "GET / HTTP/1.1\nHost: x\n\n", 200, "net/http x "},
		{"a bare line feed", "GET / HTTP/1.1\r\nHost: x\n\r\n", 200, "net/http x "},
		{"Content-Lengths differing in writing", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 02\r\n\r\nab", 400, ""},
		{"signed Content-Length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -0\r\n\r\n", 400, ""},
		{"missing Host", "GET / HTTP/1.1\r\n\r\n", 400, ""},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, ""},
		{"malformed Host", "GET / HTTP/1.1\r\nHost: x<y\r\n\r\n", 400, ""},
		{"invalid header name", "GET / HTTP/1.1\r\nHost: x\r\nBad@Name: 1\r\n\r\n", 400, ""},
		{"differing Content-Lengths", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialServer(t, ts.addr)
			c.send(tc.request)
			resp, body := c.answer("GET")
			if resp.StatusCode != tc.status || tc.status == 200 && body != tc.body {
				t.Fatalf("%d %q, want %d %q", resp.StatusCode, body, tc.status, tc.body)
			}
		})
	}
	t.Run("expect 100-continue", func(t *testing.T) {
		c := dialServer(t, ts.addr)
		c.send("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
		if resp, _ := c.answer("POST"); resp.StatusCode != 100 {
			t.Fatalf("%d, want 100 Continue", resp.StatusCode)
		}
		c.send("hello")
		if _, body := c.answer("POST"); body != "net/http x hello" {
			t.Fatalf("%q", body)
		}
	})
	t.Run("upgrade", func(t *testing.T) {
		c := dialServer(t, ts.addr)
		c.send("GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		if resp, _ := c.answer("GET"); resp.StatusCode != 101 {
			t.Fatalf("%d, want 101", resp.StatusCode)
		}
		c.send("ping\n")
		if line, err := c.br.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("%q %v", line, err)
		}
	})
	t.Run("after a request served", func(t *testing.T) {
		c := dialServer(t, ts.addr)
		c.send(get("/") + "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
		for _, want := range []string{"h1 x ", "net/http x hello"} {
			if _, body := c.answer("GET"); body != want {
				t.Fatalf("%q, want %q", body, want)
			}
		}
	})
}

// A connection handed to the Fallback can be half-closed: net/http does
// so after an error answer to a body it did not read whole (a 413 from
// http.MaxBytesReader), so that the client reads the answer, then the
// end, rather than a reset; without it, it waits and closes.
func TestServerHandedConnHalfCloses(t *testing.T) {
	conns := make(chan net.Conn, 1)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }, func(s *Server) {
		s.Fallback.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			conns <- c
			return ctx
		}
	})
	c := dialServer(t, ts.addr)
	c.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	c.answer("POST")
	cw, ok := (<-conns).(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("the connection handed to the Fallback has no CloseWrite")
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.br.ReadByte(); err != io.EOF {
		t.Fatalf("%v, want EOF", err)
	}
}

// hijackEcho switches to an echo of lines, as a WebSocket handler
// switches protocols.
func hijackEcho(w http.ResponseWriter) {
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer nc.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	_ = brw.Flush()
	line, _ := brw.ReadString('\n')
	_, _ = brw.WriteString(line)
	_ = brw.Flush()
}

// What a handler gets: the request as sent, the Host out of the header,
// the body's declared bytes and no more, the addresses; its context ends
// once it returned.
func TestServerRequest(t *testing.T) {
	type seen struct {
		r    *http.Request
		body string
		err  error
	}
	seenc := make(chan seen, 3)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		seenc <- seen{r, string(b), err}
		_, _ = io.WriteString(w, "ok")
	})
	c := dialServer(t, ts.addr)
	c.send("POST /v1/chat?a=1&b=%20 HTTP/1.1\r\nHost: example.com:8080\r\nx-multi: 1\r\nX-Multi:2\r\n" +
		"User-Agent: \t spaced \t\r\nContent-Length: 5\r\n\r\nhello" + get("/next"))
	c.answer("POST")
	c.answer("GET")
	s := <-seenc
	r := s.r
	if r.Method != "POST" || r.URL.Path != "/v1/chat" || r.URL.RawQuery != "a=1&b=%20" || r.RequestURI != "/v1/chat?a=1&b=%20" ||
		r.Proto != "HTTP/1.1" || r.ProtoMajor != 1 || r.ProtoMinor != 1 {
		t.Errorf("request line: %s %v %q %s", r.Method, r.URL, r.RequestURI, r.Proto)
	}
	if r.Host != "example.com:8080" || r.Header["Host"] != nil {
		t.Errorf("Host %q, header %q", r.Host, r.Header["Host"])
	}
	if !slices.Equal(r.Header["X-Multi"], []string{"1", "2"}) || !slices.Equal(r.Header["User-Agent"], []string{"spaced"}) {
		t.Errorf("header %q", r.Header)
	}
	if r.ContentLength != 5 || s.body != "hello" || s.err != nil {
		t.Errorf("body: length %d, %q %v", r.ContentLength, s.body, s.err)
	}
	if r.RemoteAddr != c.nc.LocalAddr().String() || r.Close {
		t.Errorf("RemoteAddr %q (want %q), Close %v", r.RemoteAddr, c.nc.LocalAddr(), r.Close)
	}
	if la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr); la == nil || la.String() != ts.addr {
		t.Errorf("LocalAddrContextKey %v, want %s", la, ts.addr)
	}
	select {
	case <-r.Context().Done():
	default:
		t.Error("the request's context is not done after its handler returned")
	}
	if next := <-seenc; next.r.URL.Path != "/next" || next.body != "" || next.r.ContentLength != 0 {
		t.Errorf("next request: %s %q %d", next.r.URL, next.body, next.r.ContentLength)
	}
	c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nhi")
	c.answer("POST")
	last := <-seenc
	if !last.r.Close {
		t.Error("Connection: close read as Close false")
	}
	// A Content-Length repeated is one, as net/http has it.
	if cl := last.r.Header["Content-Length"]; !slices.Equal(cl, []string{"2"}) || last.body != "hi" {
		t.Errorf("Content-Length %q, body %q", cl, last.body)
	}
}

// A request running past watchAfter is watched: the client leaving ends
// its context. A request the client sent meanwhile is served after it,
// whole.
func TestServerClientGone(t *testing.T) {
	setWatchAfter(t, 5*time.Millisecond)
	running := make(chan struct{}, 1)
	released := make(chan struct{})
	release := make(chan struct{})
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/wait":
			running <- struct{}{}
			<-r.Context().Done()
			close(released)
		case "/slow":
			<-release
		}
		_, _ = io.WriteString(w, r.URL.Path)
	})
	t.Run("left", func(t *testing.T) {
		c := dialServer(t, ts.addr)
		c.send("POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
		<-running
		c.nc.Close()
		select {
		case <-released:
		case <-time.After(10 * time.Second):
			t.Fatal("the handler's context did not end when the client left")
		}
	})
	t.Run("pipelined", func(t *testing.T) {
		c := dialServer(t, ts.addr)
		c.send(get("/slow"))
		// Once watched, /slow was read: /next comes after, to the
		// background read.
		waitFor(t, "the watch", func() bool {
			return connState(ts.Server, c, func(c *serverConn) bool { return c.watch == watchRunning })
		})
		c.send(get("/next"))
		waitFor(t, "the background read's byte", func() bool { return connState(ts.Server, c, func(c *serverConn) bool { return c.cr.hasOne }) })
		close(release)
		for _, want := range []string{"/slow", "/next"} {
			if _, body := c.answer("GET"); body != want {
				t.Fatalf("%q, want %q", body, want)
			}
		}
	})
}

// Many clients at once, each on its keep-alive connection, each get their
// own answers, bodies whole, with watches starting and ending under them.
func TestServerConcurrent(t *testing.T) {
	setWatchAfter(t, time.Millisecond)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.URL.Query().Has("slow") {
			time.Sleep(3 * time.Millisecond) // long enough to be watched
		}
		_, _ = w.Write(b)
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				want := fmt.Sprintf(`{"g":%d,"i":%d,"pad":%q}`, g, i, strings.Repeat("x", i*100))
				url := "http://" + ts.addr + "/"
				if i%5 == 0 {
					url += "?slow"
				}
				resp, err := client.Post(url, "application/json", strings.NewReader(want))
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
		})
	}
	wg.Wait()
}

// A body the handler leaves unread is read past to serve the next
// request, if small; a large one closes the connection, which ends (the
// client reads EOF), not resets: a reset can destroy the answer before
// the client reads it.
func TestServerUnreadBody(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.URL.Path) })
	c := dialServer(t, ts.addr)
	c.send("POST /ignore HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789" + get("/next"))
	for _, want := range []string{"/ignore", "/next"} {
		if _, body := c.answer("GET"); body != want {
			t.Fatalf("%q, want %q", body, want)
		}
	}

	c = dialServer(t, ts.addr)
	size := maxDiscard + 1<<10
	go func() {
		_, _ = io.WriteString(c.nc, fmt.Sprintf("POST /large HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size))
		_, _ = c.nc.Write(make([]byte, size)) // fails once the server closed
	}()
	if resp, body := c.answer("POST"); body != "/large" || !resp.Close {
		t.Fatalf("%q close=%v", body, resp.Close)
	}
	if _, err := io.Copy(io.Discard, c.br); err != nil {
		t.Fatalf("%v, want the connection ended", err)
	}
}

// The body stays the server's whatever the handler does with r.Body:
// replaced by a wrapper it did not read, or read by a goroutine after the
// handler returned, its bytes are never parsed as a request, and the
// next request's bytes are never read as the body.
func TestServerBodyAfterHandler(t *testing.T) {
	paths := make(chan string, 10)
	lateRead := make(chan struct{})
	late := make(chan error, 1)
	blocked := make(chan struct{})
	unblock := make(chan struct{})
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.Path
		switch r.URL.Path {
		case "/wrapped":
			r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		case "/late":
			body := r.Body
			go func() {
				<-lateRead
				n, err := body.Read(make([]byte, 64))
				if n > 0 {
					err = fmt.Errorf("read %d bytes after the handler returned", n)
				}
				late <- err
			}()
		case "/block":
			close(blocked)
			<-unblock
		}
		_, _ = io.WriteString(w, r.URL.Path)
	})
	smuggled := get("/smuggled")
	c := dialServer(t, ts.addr)
	c.send(fmt.Sprintf("POST /wrapped HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(smuggled), smuggled) + get("/next"))
	for _, want := range []string{"/wrapped", "/next"} {
		if _, body := c.answer("GET"); body != want {
			t.Fatalf("%q, want %q", body, want)
		}
	}

	c.send("POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789" + get("/block"))
	c.answer("POST")
	<-blocked
	c.send(get("/after")) // not read before /block's handler returns
	close(lateRead)
	if err := <-late; !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Errorf("a read of the body after its handler returned: %v, want ErrBodyReadAfterClose", err)
	}
	close(unblock)
	for _, want := range []string{"/block", "/after"} {
		if _, body := c.answer("GET"); body != want {
			t.Fatalf("%q, want %q", body, want)
		}
	}
	close(paths)
	var got []string
	for p := range paths {
		got = append(got, p)
	}
	if want := []string{"/wrapped", "/next", "/late", "/block", "/after"}; !slices.Equal(got, want) {
		t.Errorf("handlers ran for %q, want %q", got, want)
	}
}

// A handler's panic ends its connection, not the server: with
// http.ErrAbortHandler the answer is cut, unlogged; another value is
// logged.
func TestServerPanic(t *testing.T) {
	var logged bytes.Buffer
	var logMu sync.Mutex
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/abort":
			_, _ = io.WriteString(w, strings.Repeat("a", 3000))
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "b")
			panic(http.ErrAbortHandler)
		case "/boom":
			panic("boom")
		}
		_, _ = io.WriteString(w, "ok")
	}, func(s *Server) { s.Log = slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &logMu}, nil)) })

	c := dialServer(t, ts.addr)
	c.send(get("/abort"))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err == nil {
		t.Fatalf("an aborted answer read whole (%d bytes)", len(b))
	}
	c = dialServer(t, ts.addr)
	c.send(get("/boom"))
	c.closedByServer()
	c = dialServer(t, ts.addr)
	c.send(get("/"))
	if _, body := c.answer("GET"); body != "ok" {
		t.Fatalf("after the panics: %q", body)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if out := logged.String(); strings.Count(out, "panic serving") != 1 || !strings.Contains(out, "boom") {
		t.Errorf("log: %s", out)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Shutdown closes idle connections at once, lets a running request finish
// (its answer says close), then returns; Serve returns ErrServerClosed.
func TestServerShutdown(t *testing.T) {
	running := make(chan struct{})
	release := make(chan struct{})
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(running)
			<-release
		}
		_, _ = io.WriteString(w, r.URL.Path)
	})
	idle := dialServer(t, ts.addr)
	idle.send(get("/"))
	idle.answer("GET")
	busy := dialServer(t, ts.addr)
	busy.send(get("/slow"))
	<-running
	shut := make(chan error, 1)
	go func() { shut <- ts.Shutdown(context.Background()) }()
	idle.closedByServer()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request running", err)
	default:
	}
	close(release)
	if resp, body := busy.answer("GET"); body != "/slow" || !resp.Close {
		t.Fatalf("%q close=%v", body, resp.Close)
	}
	busy.closedByServer()
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-ts.done
	if !errors.Is(ts.err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v, want ErrServerClosed", ts.err)
	}
	if _, err := net.Dial("tcp", ts.addr); err == nil {
		t.Error("the listener still accepts")
	}
}

// A connection accepted before Shutdown whose request comes after it is
// served, not closed unread (a restart under socket activation would
// otherwise give that client an empty reply), as net/http does.
func TestServerShutdownServesANewConnectionsFirstRequest(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.URL.Path)
	})
	fresh := dialServer(t, ts.addr)
	for accepted := false; !accepted; {
		ts.mu.Lock()
		accepted = len(ts.conns) == 1
		ts.mu.Unlock()
		runtime.Gosched()
	}
	shut := make(chan error, 1)
	go func() { shut <- ts.Shutdown(context.Background()) }()
	for !ts.shutting.Load() {
		runtime.Gosched()
	}
	fresh.send(get("/late"))
	if resp, body := fresh.answer("GET"); body != "/late" || !resp.Close {
		t.Fatalf("%q close=%v", body, resp.Close)
	}
	fresh.closedByServer()
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// Shutdown with a context that ends first returns its error; Close closes
// every connection at once.
func TestServerShutdownExpiredAndClose(t *testing.T) {
	running := make(chan struct{}, 1)
	release := make(chan struct{})
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			running <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})
	defer close(release)
	idle := dialServer(t, ts.addr)
	idle.send(get("/"))
	idle.answer("GET")
	busy := dialServer(t, ts.addr)
	busy.send(get("/slow"))
	<-running
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ts.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown with an ended context: %v, want context.Canceled", err)
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	idle.closedByServer()
	busy.closedByServer()
	<-ts.done
	if !errors.Is(ts.err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v", ts.err)
	}
}

// http.ResponseController works on the writer: Flush sends the answer so
// far, the deadlines are set; and a deadline a handler set ends with its
// request, as net/http's does.
func TestServerResponseController(t *testing.T) {
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.URL.Path == "/past" {
			// The whole answer goes out first, then the deadlines pass.
			w.Header().Set("Content-Length", "2")
			_, _ = io.WriteString(w, "ok")
			err := errors.Join(rc.Flush(), rc.SetReadDeadline(time.Unix(1, 0)), rc.SetWriteDeadline(time.Unix(1, 0)))
			if err != nil {
				panic(err)
			}
			return
		}
		_, _ = io.WriteString(w, "a")
		errs := []error{rc.Flush(), rc.SetReadDeadline(time.Now().Add(time.Minute)), rc.SetWriteDeadline(time.Now().Add(time.Minute))}
		fmt.Fprintf(w, "%v", errs)
	})
	c := dialServer(t, ts.addr)
	c.send(get("/"))
	if resp, body := c.answer("GET"); body != "a[<nil> <nil> <nil>]" || resp.TransferEncoding == nil {
		t.Fatalf("%q %q, want a flushed (chunked) answer and no errors", body, resp.TransferEncoding)
	}
	c.send(get("/past"))
	if _, body := c.answer("GET"); body != "ok" {
		t.Fatalf("%q", body)
	}
	c.send(get("/"))
	if _, body := c.answer("GET"); body != "a[<nil> <nil> <nil>]" {
		t.Fatalf("after a request that set deadlines: %q", body)
	}
}

// FuzzServerHead: whatever the head, parse never panics, and a head it
// accepts net/http reads alike.
func FuzzServerHead(f *testing.F) {
	for _, seed := range []string{
		get("/"),
		"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8080\r\nContent-Type: application/json\r\nContent-Length: 17\r\nAuthorization: Bearer sk-x\r\n\r\n",
		"GET /v1/models?x=1 HTTP/1.1\r\nHost: [::1]:80\r\nAccept: */*\r\naccept: text/plain\r\nConnection: keep-alive, close\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\nX-Empty:\r\nX-Tab:\tv\t\r\n\r\n",
		"GET /a%20b HTTP/1.1\r\nHost: x\r\nX-Obs: caf\xc3\xa9\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\xc2\x85\r\n\r\n",
		"GET /a?? HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET //a/b:c@d? HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a%2Fb!c?q=%zz HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		head := in
		if i := bytes.Index(in, []byte("\r\n\r\n")); i >= 0 {
			head = in[:i+4]
		} else {
			head = append(bytes.Clone(in), "\r\n\r\n"...)
		}
		c := &serverConn{s: &Server{}, ctx: context.Background()}
		ex, ok := c.parse(head)
		if !ok {
			return
		}
		r := ex.req
		want, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil {
			t.Fatalf("parse accepted %q, net/http: %v", head, err)
		}
		if r.Method != want.Method || r.RequestURI != want.RequestURI || *r.URL != *want.URL ||
			r.Host != want.Host || r.ContentLength != want.ContentLength || r.Close != want.Close {
			t.Fatalf("%q: parsed %s %q %q %d %v, net/http %s %q %q %d %v", head,
				r.Method, r.RequestURI, r.Host, r.ContentLength, r.Close,
				want.Method, want.RequestURI, want.Host, want.ContentLength, want.Close)
		}
		if len(r.Header) != len(want.Header) {
			t.Fatalf("%q: header %q, net/http %q", head, r.Header, want.Header)
		}
		for k, vs := range want.Header {
			if !slices.Equal(r.Header[k], vs) {
				t.Fatalf("%q: header %q, net/http %q", head, r.Header, want.Header)
			}
		}
	})
}

type ctxKey struct{}

// The request's context has BaseContext's values and deadline, ends with
// its request (and so do its children, also through values wrapped
// around it), and ends when BaseContext does: the running request's at
// once; a request begun after is done from its start.
func TestServerRequestContext(t *testing.T) {
	deadline := time.Now().Add(time.Hour)
	base, cancelBase := context.WithDeadline(context.WithValue(context.Background(), ctxKey{}, "v"), deadline)
	defer cancelBase()
	type seen struct {
		ctx, child context.Context
		err        error
	}
	seenc := make(chan seen, 1)
	running := make(chan struct{}, 1)
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if d, ok := ctx.Deadline(); !ok || !d.Equal(deadline) || ctx.Value(ctxKey{}) != "v" {
			t.Errorf("deadline %v %v, value %v: want BaseContext's", d, ok, ctx.Value(ctxKey{}))
		}
		switch r.URL.Path {
		case "/wait":
			running <- struct{}{}
			<-ctx.Done()
		case "/child":
			// Ended by its parent, after the handler returned.
			child, cancel := context.WithCancel(context.WithValue(ctx, ctxKey{}, "w"))
			go func() { <-child.Done(); cancel() }()
			seenc <- seen{ctx: ctx, child: child, err: child.Err()}
			return
		}
		seenc <- seen{ctx: ctx, err: ctx.Err()}
	}, func(s *Server) { s.BaseContext = base })

	c := dialServer(t, ts.addr)
	c.send(get("/child"))
	c.answer("GET")
	s := <-seenc
	if s.err != nil || s.ctx.Err() != context.Canceled || context.Cause(s.ctx) != context.Canceled || s.child.Err() != context.Canceled {
		t.Fatalf("while running %v; after: %v, cause %v, child %v", s.err, s.ctx.Err(), context.Cause(s.ctx), s.child.Err())
	}
	c.send(get("/wait"))
	<-running
	cancelBase()
	if s := <-seenc; s.err != context.Canceled {
		t.Fatalf("BaseContext ended: the running request's context ended with %v", s.err)
	}
	c.answer("GET")
	c.send(get("/"))
	c.answer("GET")
	if s := <-seenc; s.err != context.Canceled {
		t.Fatalf("a request begun after BaseContext ended: %v", s.err)
	}
}

// The Date header is the wall clock's second when the answer goes out,
// also across the change of a second.
func TestDate(t *testing.T) {
	first := date()
	for {
		before := time.Now().Truncate(time.Second)
		d := date()
		after := time.Now()
		got, err := http.ParseTime(d)
		if err != nil || got.Before(before) || got.After(after) {
			t.Fatalf("Date %q (%v) between %v and %v", d, err, before, after)
		}
		if d != first {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
