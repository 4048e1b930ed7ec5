package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestConnLimit_RefusesPastTheLimitAndLogsOncePerBurst(t *testing.T) {
	logs := &syncBuffer{}
	limit := NewConnLimit(2, slog.New(slog.NewTextHandler(logs, nil)))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(limit.Listener(l)) }()
	t.Cleanup(func() { srv.Close() })

	get := func(c net.Conn) (*http.Response, error) {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Two keep-alive connections hold both places.
	held := []net.Conn{dial(), dial()}
	for _, c := range held {
		if resp, err := get(c); err != nil || resp.StatusCode != 200 {
			t.Fatalf("within the limit: %v %v", resp, err)
		}
	}
	for i := range 3 {
		resp, err := get(dial())
		if err != nil {
			t.Fatalf("connection %d past the limit: %v (want a 503 answer)", i, err)
		}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Errorf("past the limit: %d %v", resp.StatusCode, resp.Header)
		}
	}
	if n := strings.Count(logs.String(), "connection limit reached"); n != 1 {
		t.Errorf("%d warnings for one burst of refusals:\n%s", n, logs.String())
	}
	if limit.Open() != 2 {
		t.Errorf("Open() = %d, want 2", limit.Open())
	}
	// A place frees up: the next connection is served, and the burst ends.
	held[0].Close()
	deadline := time.Now().Add(30 * time.Second)
	for limit.Open() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling the server's close of the connection
	}
	if resp, err := get(dial()); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after a close: %v %v", resp, err)
	}
	if !strings.Contains(logs.String(), "accepting connections again") {
		t.Errorf("end of the burst not logged:\n%s", logs.String())
	}
}

// flakyListener fails Accept with EMFILE n times, then accepts.
type flakyListener struct {
	net.Listener
	fails int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

func TestConnLimit_AcceptErrorsLoggedOncePerBurst(t *testing.T) {
	logs := &syncBuffer{}
	limit := NewConnLimit(10, slog.New(slog.NewTextHandler(logs, nil)))
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	l := limit.Listener(&flakyListener{Listener: inner, fails: 5})
	for range 5 {
		if _, err := l.Accept(); !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("Accept = %v, want EMFILE passed on (net/http backs off)", err)
		}
	}
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings for one burst of 5 accept errors:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "accept_errors=5") {
		t.Errorf("the end of the burst does not count its errors:\n%s", logs.String())
	}
}

// A counted connection half-closes as its socket does (net/http's server
// does so before closing a connection whose request body it left unread):
// the client reads the end, and may still send.
func TestConnLimit_CountedConnClosesWrite(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := NewConnLimit(4, slog.New(slog.DiscardHandler)).Listener(l)
	defer ll.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := ll.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("%T cannot half-close", c)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	if n, err := client.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("client read %d, %v; want EOF", n, err)
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
		t.Fatalf("server read %q, %v", b, err)
	}
	a, _ := net.Pipe()
	defer a.Close()
	if err := (&countedConn{Conn: a}).CloseWrite(); err != nil {
		t.Errorf("a pipe's CloseWrite: %v, want nothing done", err)
	}
}
