package h1

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	a, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// sockIO reads and writes as net.Conn does: the same bytes, the same
// errors (deadline, end, closed, reset), a write past the socket's buffer
// waits for room.
func TestSockIO(t *testing.T) {
	if s := newSockIO(pipeConn(t)); s != nil {
		t.Error("a sockIO for a connection without a socket")
	}
	a, b := tcpPair(t)
	s := newSockIO(a)
	if s == nil {
		t.Fatal("no sockIO for a TCP connection")
	}

	// Much more than the socket buffers hold: the write waits for room.
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(b, int64(len(big))))
		got <- b
	}()
	if n, err := s.Write(big); n != len(big) || err != nil {
		t.Fatalf("Write: %d %v", n, err)
	}
	if g := <-got; !bytes.Equal(g, big) {
		t.Fatalf("read %d bytes, not those written", len(g))
	}

	if _, err := b.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := s.Read(buf); string(buf[:n]) != "hello" || err != nil {
		t.Fatalf("Read: %q %v", buf[:n], err)
	}
	if n, err := s.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty Read: %d %v", n, err)
	}

	_ = a.SetReadDeadline(time.Now().Add(-time.Second))
	_, err := s.Read(buf)
	var ne net.Error
	var oe *net.OpError
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() ||
		!errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("Read past the deadline: %v", err)
	}
	_ = a.SetReadDeadline(time.Time{})

	b.Close()
	if n, err := s.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("Read at the end: %d %v, want io.EOF", n, err)
	}
	a.Close()
	if _, err := s.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := s.Write(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// A write to a connection its peer reset fails with the system's error,
// as net.Conn's does.
func TestSockIOWriteReset(t *testing.T) {
	a, b := tcpPair(t)
	_ = b.(*net.TCPConn).SetLinger(0)
	b.Close() // RST
	s := newSockIO(a)
	var err error
	for i := 0; err == nil && i < 100; i++ {
		_, err = s.Write([]byte("data"))
		time.Sleep(time.Millisecond) // the RST's arrival, not a result
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" ||
		!(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		t.Fatalf("Write to a reset connection: %v", err)
	}
}

// pipeConn is a connection without a socket.
func pipeConn(t *testing.T) net.Conn {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}

// The server and the Transport read and write their TCP connections
// through sockIO.
func TestSockIOUsed(t *testing.T) {
	a, _ := tcpPair(t)
	s := &Server{}
	if c := s.newConn(a); c == nil {
		t.Fatal("no connection")
	} else if _, ok := c.rw.(*sockIO); !ok {
		t.Errorf("the server reads and writes a TCP connection through %T", c.rw)
	}

	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "okay") })
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	if status, body := roundTrip(t, tr, post(t, context.Background(), srv.URL, "{}")); status != http.StatusOK || body != "okay" {
		t.Fatalf("%d %q", status, body)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.idle) != 1 {
		t.Fatalf("%d idle connections", len(tr.idle))
	}
	if _, ok := tr.idle[0].rw.(*sockIO); !ok {
		t.Errorf("the Transport reads and writes a TCP connection through %T", tr.idle[0].rw)
	}
}
