package gateway

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
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
	if n := strings.Count(logs.String(), "max_connections reached"); n != 1 {
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
