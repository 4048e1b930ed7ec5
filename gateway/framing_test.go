package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// framingEngine records each request it gets as "METHOD PATH BODY", with
// the framing headers it saw.
type framingEngine struct {
	mu   sync.Mutex
	seen []string
}

func (f *framingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	f.mu.Lock()
	line := fmt.Sprintf("%s %s %s", r.Method, r.URL.Path, b)
	if err != nil {
		line += " (" + err.Error() + ")"
	}
	if te := r.TransferEncoding; len(te) > 0 && len(r.Header["Content-Length"]) > 0 {
		line += " (Transfer-Encoding and Content-Length)"
	}
	f.seen = append(f.seen, line)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`)
}

func (f *framingEngine) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// rawAnswers sends request on a connection of its own and reads the
// answers until the connection closes or goes quiet, as "STATUS BODY".
func rawAnswers(t *testing.T, addr, request string) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var got []string
	for {
		// Long enough for an answer on a busy machine; a kept-alive
		// connection with nothing more to say ends the reading.
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return got
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, b))
		if resp.Close {
			return got
		}
	}
}

const (
	framedBody = `{"model":"m1"}`
	// canary ends every request list: read as a request of its own, it
	// ends the connection.
	canary = "GET /upstream/m1/canary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
)

// Requests whose framing is ambiguous or unusual, written raw on napd's
// gateway socket as napd serves it: each is refused, or read exactly as
// RFC 9112 frames it, and what reaches the engine is framed by napd
// alone (one Content-Length, never both framings), so a request's end
// cannot be read in two ways on the path to the engine.
func TestGateway_Framing(t *testing.T) {
	ok := "200 " + `{"ok":true}`
	post := "POST /v1/completions " + framedBody
	for _, c := range []struct {
		name, request string
		// answers and engine are what napd and the engine must see when
		// napd takes the request; refused: a 4xx closing the connection,
		// with nothing reaching the engine, is the other allowed outcome.
		answers, engine []string
		refused         bool
	}{
		{
			name: "Content-Length and Transfer-Encoding",
			request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(framedBody), framedBody) + canary,
			// Transfer-Encoding wins (RFC 9112, 6.3), and the
			// connection is closed after the answer: the canary after
			// it is not read.
			answers: []string{ok}, engine: []string{post}, refused: true,
		},
		{
			name: "two differing Content-Lengths",
			request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 14\r\n\r\n" +
				framedBody + canary,
			refused: true,
		},
		{
			name: "a list of Content-Lengths",
			request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 14, 3\r\n\r\n" +
				framedBody + canary,
			refused: true,
		},
		{
			name: "a Transfer-Encoding other than chunked",
			request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(framedBody), framedBody) + canary,
			refused: true,
		},
		{
			name: "obsolete line folding",
			request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-A: a\r\n Content-Length: 3\r\nContent-Length: 14\r\n\r\n" +
				framedBody + canary,
			// Folded into X-A, never a header of its own.
			answers: []string{ok, "200 " + `{"ok":true}`}, engine: []string{post, "GET /canary "}, refused: true,
		},
		{
			name:    "bare line feeds",
			request: "POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 14\n\n" + framedBody + canary,
			answers: []string{ok, ok}, engine: []string{post, "GET /canary "}, refused: true,
		},
		{
			name: "a chunk size beyond any body",
			request: "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"fffffffffffffffffff\r\n" + framedBody + "\r\n0\r\n\r\n",
			refused: true,
		},
		{
			name: "pipelined requests",
			request: fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(framedBody), framedBody) +
				fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(framedBody), framedBody) + canary,
			answers: []string{ok, ok, ok}, engine: []string{post, post, "GET /canary "},
		},
		{
			name:    "HTTP/1.0",
			request: fmt.Sprintf("POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s", len(framedBody), framedBody) + canary,
			// No keep-alive asked: the connection ends with the answer.
			answers: []string{ok}, engine: []string{post},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			engine := &framingEngine{}
			e := newEnv(t, engine.ServeHTTP, Options{MaxBody: 1 << 20})
			got := rawAnswers(t, e.srv.Listener.Addr().String(), c.request)
			seen := engine.got()
			t.Logf("answers %q, engine saw %q", got, seen)
			refusedNow := len(got) == 1 && got[0] >= "400" && len(seen) == 0
			if c.refused && refusedNow {
				return
			}
			if c.answers == nil {
				t.Fatalf("answers %q, engine saw %q; want a refusal", got, seen)
			}
			// A taken request may end the connection after its answer
			// (what follows is then not read at all), never read on in
			// another framing.
			if n := len(got); n == 0 || n > len(c.answers) || !slices.Equal(got, c.answers[:n]) ||
				!slices.Equal(seen, c.engine[:min(n, len(c.engine))]) {
				t.Fatalf("answers %q, engine saw %q; want %q and %q (or a prefix of both)", got, seen, c.answers, c.engine)
			}
		})
	}
}

// A body announced beyond max_body with Expect: 100-continue is refused
// with 413 before the client sends it: no 100 Continue, no byte read.
func TestGateway_ExpectBeyondMaxBody(t *testing.T) {
	engine := &framingEngine{}
	e := newEnv(t, engine.ServeHTTP, Options{MaxBody: 1 << 10})
	c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 2<<10)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	wantError(t, resp, b, http.StatusRequestEntityTooLarge, "request_too_large")
	if seen := engine.got(); len(seen) != 0 {
		t.Errorf("the engine saw %q", seen)
	}
	// Within max_body, the client is told to go on.
	c2, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	fmt.Fprintf(c2, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(framedBody))
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c2)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("%v %v, want 100 Continue", resp, err)
	}
	_, _ = io.WriteString(c2, framedBody)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%v %v, want 200", resp, err)
	}
	e.models.outcome()
}
