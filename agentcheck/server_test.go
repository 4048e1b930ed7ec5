package agentcheck

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func lookupOf(models map[string]Status) Lookup {
	return func(name string) (Status, bool) {
		st, ok := models[name]
		return st, ok
	}
}

var testModels = lookupOf(map[string]Status{
	"a": {Health: Serving, State: "awake", QueueDepth: 1},
	"s": {Health: Wakeable, State: "sleeping"},
})

// ask sends line on c and returns everything read until the server closes.
func ask(t *testing.T, c net.Conn, line string) string {
	t.Helper()
	defer c.Close()
	if line != "" {
		if _, err := io.WriteString(c, line); err != nil {
			t.Fatalf("write %q: %v", line, err)
		}
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read answer to %q: %v", line, err)
	}
	return string(b)
}

// TestServer_TCP runs the server on a real socket, as HAProxy reaches it.
func TestServer_TCP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(testModels, Options{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	for line, want := range map[string]string{
		"a\n":         "up ready 100% #awake, 1 queued\n",
		"s awake\r\n": "up ready 0% #sleeping, 0 queued\n",
		"s\n":         "up ready 1% #sleeping, 0 queued\n",
		"zz\n":        "down #no model zz\n",
		"a b c\n":     "down #napd: 3 words: want MODEL or MODEL awake\n",
	} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if got := ask(t, c, line); got != want {
			t.Errorf("answer to %q = %q, want %q", line, got, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != net.ErrClosed {
		t.Errorf("Serve after Close = %v, want net.ErrClosed", err)
	}
}

// pipeListener hands out the server ends of net.Pipe connections, so the
// server runs inside a synctest bubble.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "unix"} }

func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

// serveInBubble starts s on a pipe listener and stops it when the test
// function returns.
func serveInBubble(t *testing.T, s *Server) *pipeListener {
	l := newPipeListener()
	go func() { _ = s.Serve(l) }()
	t.Cleanup(func() { s.Close() })
	return l
}

// TestServer_LineTooLong: a line longer than MaxLine is answered `down`
// without reading further.
func TestServer_LineTooLong(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := serveInBubble(t, New(testModels, Options{MaxLine: 16}))
		c := l.dial()
		go func() { _, _ = io.WriteString(c, strings.Repeat("x", 64)+"\n") }()
		b, _ := io.ReadAll(c)
		if got := string(b); got != "down #napd: request line too long\n" {
			t.Errorf("answer to a 65-byte line = %q", got)
		}
		c.Close()
		// One byte under the limit is still a request.
		if got := ask(t, l.dial(), strings.Repeat("y", 15)); got != "" {
			t.Errorf("a 15-byte line without newline got %q before the timeout", got)
		}
	})
}

// TestServer_ReadTimeout: a client that never finishes its line is closed
// without an answer once ReadTimeout has passed, and not before.
func TestServer_ReadTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := serveInBubble(t, New(testModels, Options{ReadTimeout: 3 * time.Second}))
		c := l.dial()
		if _, err := io.WriteString(c, "a"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		b, _ := io.ReadAll(c)
		if len(b) != 0 {
			t.Errorf("answer without a newline: %q", b)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("closed after %v, want the 3s read timeout", waited)
		}
	})
}

// TestServer_ConnectionLimit: beyond MaxConns a connection is closed at
// once; a slot freed is usable again.
func TestServer_ConnectionLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := serveInBubble(t, New(testModels, Options{MaxConns: 2, ReadTimeout: time.Hour}))
		held := []net.Conn{l.dial(), l.dial()}
		synctest.Wait() // both are being served, waiting for their lines
		start := time.Now()
		if got := ask(t, l.dial(), ""); got != "" {
			t.Errorf("third connection answered %q, want it closed", got)
		}
		if time.Since(start) != 0 {
			t.Errorf("third connection closed after %v, want at once", time.Since(start))
		}
		if got := ask(t, held[0], "s\n"); got != "up ready 1% #sleeping, 0 queued\n" {
			t.Errorf("held connection answered %q", got)
		}
		synctest.Wait() // its slot is back
		if got := ask(t, l.dial(), "a\n"); got != "up ready 100% #awake, 1 queued\n" {
			t.Errorf("connection after a slot freed answered %q", got)
		}
		held[1].Close()
	})
}

// TestServer_CloseEndsConnections: Close does not wait out a client that
// holds its connection open.
func TestServer_CloseEndsConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(testModels, Options{ReadTimeout: time.Hour})
		l := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- s.Serve(l) }()
		c := l.dial()
		synctest.Wait()
		start := time.Now()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) != 0 {
			t.Errorf("Close took %v", time.Since(start))
		}
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("closed connection got %q", b)
		}
		if err := <-served; err != net.ErrClosed {
			t.Errorf("Serve = %v, want net.ErrClosed", err)
		}
		if err := s.Serve(newPipeListener()); err != net.ErrClosed {
			t.Errorf("Serve after Close = %v, want net.ErrClosed", err)
		}
	})
}

// TestServer_AskedAgain: AskedAgain waits until every request asked over
// and over lately has been answered again; one asked only before the
// lookback, or only once, is not waited for; ctx ends the wait.
func TestServer_AskedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(testModels, Options{})
		l := serveInBubble(t, s)
		ask(t, l.dial(), "s\n") // long before: outside the lookback
		ask(t, l.dial(), "s\n")
		time.Sleep(time.Minute)
		for range 2 { // as a balancer asks, every second
			ask(t, l.dial(), "a\n")
			ask(t, l.dial(), "s awake\n")
			time.Sleep(time.Second)
		}
		ask(t, l.dial(), "zz\n") // once: an operator's question
		time.Sleep(time.Second)
		since := time.Now()
		done := make(chan error, 1)
		go func() { done <- s.AskedAgain(context.Background(), since, 10*time.Second) }()
		pending := func(what string) {
			synctest.Wait()
			select {
			case err := <-done:
				t.Fatalf("AskedAgain returned (%v) %s", err, what)
			default:
			}
		}
		pending("before anything was asked again")
		ask(t, l.dial(), "a\n")
		pending("with `s awake` not asked again")
		ask(t, l.dial(), "s awake\n")
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("AskedAgain = %v", err)
			}
		default:
			t.Fatal("AskedAgain still waits after every request was asked again")
		}

		time.Sleep(time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		if err := s.AskedAgain(ctx, time.Now(), 10*time.Second); err != context.DeadlineExceeded || time.Since(start) != 3*time.Second {
			t.Errorf("AskedAgain with nobody asking = %v after %v, want the deadline after 3s", err, time.Since(start))
		}
	})
}
