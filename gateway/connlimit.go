package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ConnLimit caps the client connections open at once across every listener
// it wraps (max_connections for the gateway's). Its log lines say which
// listeners through the logger's attributes. Past the cap a new connection is answered 503
// and closed at once, as nginx does past worker_connections, so napd never
// runs out of descriptors (the control socket and the engines need some).
// Refusals and accept errors are logged at warning level once per burst.
type ConnLimit struct {
	max  int64
	open atomic.Int64
	log  *slog.Logger

	mu       sync.Mutex
	refused  int // connections refused in the current burst
	failures int // accept errors in the current burst
	refusing int // 503 answers being written now
}

// NewConnLimit returns a limit of max connections. A max the process's
// file limit cannot hold (two descriptors per connection: client and
// engine, plus a reserve) is lowered to what it can, with a warning.
func NewConnLimit(limit int, log *slog.Logger) *ConnLimit {
	if log == nil {
		log = slog.Default()
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < uint64(1<<31) {
		if fit := (int(rl.Cur) - fdReserve) / 2; fit < limit {
			log.Warn("connection limit lowered to what the open-file limit holds",
				"limit", limit, "lowered_to", fit, "nofile", rl.Cur)
			limit = fit
		}
	}
	return &ConnLimit{max: int64(max(limit, 1)), log: log}
}

// fdReserve are descriptors kept for everything but client connections:
// listeners, the control socket, engine processes, logs, state files.
const fdReserve = 256

// Open is the number of connections open now.
func (c *ConnLimit) Open() int { return int(c.open.Load()) }

// Listener wraps l so its connections count against c.
func (c *ConnLimit) Listener(l net.Listener) net.Listener {
	return &limitedListener{Listener: l, c: c}
}

type limitedListener struct {
	net.Listener
	c *ConnLimit
}

// overloaded is what a connection past the limit gets before it is closed.
var overloaded = func() []byte {
	body := `{"error":{"message":"napd has too many open connections (max_connections); retry shortly","type":"server_error","code":"too_many_connections","param":null}}`
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			l.c.acceptFailed(err)
			return nil, err
		}
		if l.c.open.Add(1) > l.c.max {
			l.c.open.Add(-1)
			l.c.refuse(conn)
			continue
		}
		l.c.accepted()
		return &countedConn{Conn: conn, c: l.c}, nil
	}
}

// refuse answers 503 and closes. The answer follows the request's head
// (an HTTP client treats an answer that comes before its request as a
// broken connection); that wait is bounded by refuseWait, and at most
// maxRefusing connections are answered at once: past that, during a flood,
// a connection is closed without an answer, as nginx does.
func (c *ConnLimit) refuse(conn net.Conn) {
	c.mu.Lock()
	c.refused++
	if c.refused == 1 {
		c.log.Warn("connection limit reached: refusing new connections", "limit", c.max)
	}
	answer := c.refusing < maxRefusing
	if answer {
		c.refusing++
	}
	c.mu.Unlock()
	if !answer {
		_ = conn.Close()
		return
	}
	go func() {
		defer func() {
			c.mu.Lock()
			c.refusing--
			c.mu.Unlock()
		}()
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(refuseWait))
		head := make([]byte, 0, 4<<10)
		for len(head) < cap(head) && !bytes.Contains(head, []byte("\r\n\r\n")) {
			n, err := conn.Read(head[len(head):cap(head)])
			head = head[:len(head)+n]
			if err != nil {
				break
			}
		}
		_, _ = conn.Write(overloaded)
	}()
}

// Bounds of the 503 answers past max_connections.
const (
	refuseWait  = time.Second
	maxRefusing = 64
)

// acceptFailed logs the first accept error of a burst (EMFILE and the like:
// net/http retries them with a backoff).
func (c *ConnLimit) acceptFailed(err error) {
	if errors.Is(err, net.ErrClosed) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	if c.failures == 1 {
		c.log.Warn("accept failing; retrying", "err", err, "open_connections", c.open.Load())
	}
}

// accepted ends a burst of refusals or failures, saying how long it was.
func (c *ConnLimit) accepted() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused > 0 || c.failures > 0 {
		c.log.Info("accepting connections again", "refused", c.refused, "accept_errors", c.failures)
		c.refused, c.failures = 0, 0
	}
}

type countedConn struct {
	net.Conn
	c      *ConnLimit
	closed atomic.Bool
}

// CloseWrite half-closes a TCP connection, so a server can send its last
// answer and still read what the client sends (net/http does, before
// closing a connection with a body unread).
func (cc *countedConn) CloseWrite() error {
	if cw, ok := cc.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (cc *countedConn) Close() error {
	if cc.closed.CompareAndSwap(false, true) {
		cc.c.open.Add(-1)
	}
	return cc.Conn.Close()
}
