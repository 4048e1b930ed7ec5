package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
)

// frozenListener is a port whose accept queue is full and never drained,
// as with a SIGSTOPped engine: a new connection attempt hangs.
func frozenListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
	// Fill the queue until an attempt hangs.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return addr
		}
		t.Cleanup(func() { c.Close() })
		if i > 64 {
			t.Skip("the kernel keeps accepting connections on a full queue")
		}
	}
}

// A frozen engine that does not accept the connection in time is the
// engine's fault: 502 that says so, long before the request's deadline,
// and the model layer learns the engine never saw the request. Only the
// request's own deadline is a 504.
func TestGateway_ConnectTimeoutIs502(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{RequestTimeout: time.Minute})
	addr := frozenListener(t)
	e.models.target.Host = addr
	// napd's transport, with a dial bound shorter than DialTimeout.
	tr := NewTransport(1, nil)
	tr.DialContext = (&net.Dialer{Timeout: 300 * time.Millisecond}).DialContext
	e.models.transport = tr
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	wantError(t, resp, b, http.StatusBadGateway, "engine_unreachable")
	if !strings.Contains(string(b), "did not accept a connection in time") {
		t.Errorf("message %s", b)
	}
	if o := e.models.outcome(); o.Fault != FaultConnectTimeout || !o.Fault.Unreached() {
		t.Errorf("outcome %+v, want a connect timeout", o)
	}
}

// An engine that does not answer within the request's deadline: 504 at
// the deadline, on a connection the transport reuses, and the lease ends
// cancelled.
func TestGateway_EngineSilentPastTheDeadlineIs504(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Warm") != "" {
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}, Options{})
	defer close(release)
	e.client.Timeout = 10 * time.Second // a missed deadline fails, not hangs
	{
		if resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{"X-Warm": "1"}); resp.StatusCode != 200 {
			t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
		}
		e.models.outcome()
		start := time.Now()
		resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{HeaderRequestTimeout: "0.2"})
		wantError(t, resp, b, http.StatusGatewayTimeout, "timeout")
		if d := time.Since(start); d < 200*time.Millisecond || d > 5*time.Second {
			t.Errorf("504 after %v, want at the 200 ms deadline", d)
		}
		if o := e.models.outcome(); !o.Cancelled {
			t.Errorf("outcome %+v, want cancelled", o)
		}
	}
}

func TestGateway_RefusedConnectionIsUnreached(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	e.engine.Close()
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	wantError(t, resp, b, http.StatusBadGateway, "engine_unreachable")
	if o := e.models.outcome(); o.Fault != FaultRefused || !o.Fault.Unreached() {
		t.Errorf("outcome %+v, want refused", o)
	}
}

// rawEngine answers every request with head and body written raw on the
// connection, then closes it (an engine that dies mid-answer, or one that
// ends answers by closing the connection).
func rawEngine(head, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\n" + head + "\r\n" + body)
		_ = buf.Flush()
	}
}

// An answer the engine did not finish is never stored for replay, is cut
// for the client too (not ended as if complete), and is logged as cut;
// one it finished is stored, whatever its framing.
func TestGateway_CutAnswerIsNeitherStoredNorEndedAsComplete(t *testing.T) {
	const sse = "Content-Type: text/event-stream\r\nConnection: close\r\n"
	const js = "Content-Type: application/json\r\nConnection: close\r\n"
	for _, tc := range []struct {
		name, head, body string
		cut              bool
	}{
		{"stream closed before [DONE]", sse, "data: {\"n\":1}\n\n", true},
		{"stream closed after [DONE]", sse, "data: {\"n\":1}\n\ndata: [DONE]\n\n", false},
		{"anthropic stream closed after message_stop", sse, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", false},
		{"JSON closed mid-object", js, `{"id":"x","choices":[`, true},
		{"JSON closed at its end", js, `{"id":"x","choices":[]}`, false},
		{"chunked stream cut", "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n", "c\r\ndata: one\n\n\r\n", true},
		{"content-length cut", "Content-Type: application/json\r\nContent-Length: 100\r\n", `{"id":`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, rawEngine(tc.head, tc.body), Options{})
			req, _ := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`))
			req.Header.Set(HeaderIdempotencyKey, "k")
			// An answer of known length leaves with its head once it is
			// whole, so the client of one cut early sees no head at all.
			resp, readErr := e.client.Do(req)
			if readErr == nil {
				_, readErr = io.ReadAll(bufio.NewReader(resp.Body))
				resp.Body.Close()
			} else if !tc.cut {
				t.Fatal(readErr)
			}
			o := e.models.outcome()
			if tc.cut {
				if readErr == nil {
					t.Error("the client's answer ended as if complete")
				}
				if o.Response != nil || !o.Cancelled || o.Fault != FaultCut {
					t.Errorf("outcome %+v, want cut and nothing stored", o)
				}
				if !strings.Contains(e.logs.String(), `"engine_fault":"cut"`) {
					t.Errorf("not logged as cut:\n%s", e.logs.String())
				}
				return
			}
			if readErr != nil || o.Response == nil || o.Cancelled || o.Fault != FaultNone {
				t.Errorf("complete answer: read %v, outcome %+v", readErr, o)
			}
		})
	}
}

// A request whose connection was refused never reached the engine: it is
// handed back to the model and waits for the next instance instead of
// failing with 502, its body sent again whole and its header as the first
// attempt's; the lease is still ended once.
func TestGateway_RefusedRequestIsRerouted(t *testing.T) {
	engine := &okEngine{}
	e := newEnv(t, engine.ServeHTTP, Options{})
	live := e.models.target
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	deadURL, _ := url.Parse(dead.URL)
	{
		rt := e.models.transport
		var reroutes atomic.Int32
		e.models.admit = func(ctx context.Context, a lease.Request) (*Ticket, error) {
			t := e.models.ticket(0)
			t.Target = deadURL
			t.Reroute = func(ctx context.Context) (*Ticket, error) {
				reroutes.Add(1)
				return &Ticket{Target: live, Transport: rt, WakeWait: 250 * time.Millisecond}, nil
			}
			return t, nil
		}
		resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1","n":1}`,
			map[string]string{"Cookie": "a=1", "X-Forwarded-For": "10.9.9.9", "Connection": "X-Hop", "X-Hop": "1", "X-Kept": "yes"})
		if resp.StatusCode != http.StatusOK || string(b) != `{"ok":true}` {
			t.Fatalf("rerouted request: %d %s", resp.StatusCode, b)
		}
		// The header made for the first attempt.
		if h := engine.seen()[len(engine.seen())-1].header; h["Cookie"] != nil || h["X-Hop"] != nil ||
			len(h["X-Forwarded-For"]) != 1 || h.Get("X-Forwarded-For") != "127.0.0.1" || h.Get("X-Kept") != "yes" {
			t.Errorf("the rerouted request's header: %v", h)
		}
		if reroutes.Load() != 1 || resp.Header.Get(HeaderWakeMs) != "250" {
			t.Errorf("%d reroutes, %s %q", reroutes.Load(), HeaderWakeMs, resp.Header.Get(HeaderWakeMs))
		}
		if s := engine.seen(); string(s[len(s)-1].body) != `{"model":"m1","n":1}` {
			t.Errorf("the engine read %q", s[len(s)-1].body)
		}
		if o := e.models.outcome(); o.Cancelled || o.Fault != FaultNone {
			t.Errorf("outcome %+v", o)
		}
		e.models.noMoreDone()
	}

	// The model cannot take it back: its refusal is the answer.
	e.models.admit = func(ctx context.Context, a lease.Request) (*Ticket, error) {
		t := e.models.ticket(0)
		t.Target = deadURL
		t.Reroute = func(ctx context.Context) (*Ticket, error) {
			return nil, &Refusal{Status: http.StatusServiceUnavailable, Code: "model_failed", Message: "m1 failed", RetryAfter: time.Second}
		}
		return t, nil
	}
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	wantError(t, resp, b, http.StatusServiceUnavailable, "model_failed")
	if resp.Header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	if o := e.models.outcome(); !o.Cancelled {
		t.Errorf("outcome %+v", o)
	}
}
