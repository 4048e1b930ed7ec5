package agentcheck

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Defaults of Options. HAProxy sends its line at once and reads one line
// back, so every connection is short: a handful at a time is normal, and
// these bounds only stop a client that holds connections open.
const (
	DefaultMaxLine     = 256
	DefaultReadTimeout = 5 * time.Second
	DefaultMaxConns    = 64
)

// Options bound the server. The zero value of each field is its default.
type Options struct {
	// MaxLine is the longest request line accepted, newline included; a
	// longer one is answered `down` and the connection closed.
	MaxLine int
	// ReadTimeout bounds a connection's whole life: reading the line and
	// writing the answer. A client that sends no newline in time is closed
	// without an answer.
	ReadTimeout time.Duration
	// MaxConns is how many connections are served at once; more are closed
	// as soon as they are accepted (HAProxy keeps the server's last state).
	MaxConns int
	// Logger receives refused and timed-out connections at debug level;
	// nil means slog.Default().
	Logger *slog.Logger
}

// Lookup returns the status of a model by name or alias; false when there
// is no such model. It must be cheap and must not block: it is called for
// every check.
type Lookup func(model string) (Status, bool)

// Server answers agent checks on one or more listeners.
type Server struct {
	lookup Lookup
	opts   Options
	log    *slog.Logger
	slots  chan struct{}

	mu     sync.Mutex
	open   map[io.Closer]struct{} // listeners and connections, closed by Close
	closed bool
	wg     sync.WaitGroup // one per tracked listener or connection
	// asked is when each request answered was answered the last two
	// times (at most maxAsked of them); answered is closed and replaced at
	// each answer.
	asked    map[Request]askedAt
	answered chan struct{}
}

type askedAt struct{ prev, last time.Time }

// maxAsked bounds the requests AskedAgain keeps track of: a balancer asks
// a few per model; a client sending endless others is not followed.
const maxAsked = 1024

// New returns a server that answers from lookup.
func New(lookup Lookup, o Options) *Server {
	if o.MaxLine <= 0 {
		o.MaxLine = DefaultMaxLine
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	s := &Server{lookup: lookup, opts: o, log: o.Logger, slots: make(chan struct{}, o.MaxConns),
		open: make(map[io.Closer]struct{}), asked: make(map[Request]askedAt), answered: make(chan struct{})}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// Serve accepts connections on l until Close (or until l is closed), then
// returns net.ErrClosed.
func (s *Server) Serve(l net.Listener) error {
	if !s.track(l) {
		l.Close()
		return net.ErrClosed
	}
	defer s.untrack(l)
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return net.ErrClosed
			}
			// Out of descriptors and the like: wait and try again,
			// as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("agent check listener: accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		select {
		case s.slots <- struct{}{}:
		default:
			s.log.Debug("agent check refused: too many connections", "remote", c.RemoteAddr().String(), "limit", s.opts.MaxConns)
			c.Close()
			continue
		}
		if !s.track(c) {
			<-s.slots
			c.Close()
			continue
		}
		go func() {
			defer func() { <-s.slots }()
			defer s.untrack(c)
			s.serveConn(c)
		}()
	}
}

// serveConn reads one request line and writes its answer.
func (s *Server) serveConn(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(s.opts.ReadTimeout))
	line, err := readLine(c, s.opts.MaxLine)
	var answer string
	var req Request
	asked := false
	switch {
	case errors.Is(err, errTooLong):
		answer = refusal(err)
	case err != nil:
		// No newline in time, or the client left: nothing to answer.
		s.log.Debug("agent check without a request line", "remote", c.RemoteAddr().String(), "err", err)
		return
	default:
		var perr error
		if req, perr = ParseRequest(line); perr != nil {
			answer = refusal(perr)
		} else {
			st, ok := s.lookup(req.Model)
			answer, asked = Answer(req, st, ok), true
		}
	}
	if _, err := io.WriteString(c, answer); err == nil && asked {
		s.heard(req)
	}
}

// heard notes that req was just answered.
func (s *Server) heard(req Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.asked[req]
	if !ok && len(s.asked) >= maxAsked {
		return
	}
	s.asked[req] = askedAt{prev: at.last, last: time.Now()}
	close(s.answered)
	s.answered = make(chan struct{})
}

// AskedAgain returns once every request asked over and over (twice, at
// most lookback apart, the second time within lookback before since) has
// been answered again since, or with ctx's error when ctx ends first. A
// stopping napd calls it after its answers turned to drain: each balancer
// checking it has then been told before the gateway closes; a one-off
// question (an operator's) is not waited for.
func (s *Server) AskedAgain(ctx context.Context, since time.Time, lookback time.Duration) error {
	for {
		s.mu.Lock()
		waiting := false
		for _, at := range s.asked {
			if at.last.Before(since) && !at.last.Before(since.Add(-lookback)) && !at.prev.IsZero() && at.last.Sub(at.prev) <= lookback {
				waiting = true
				break
			}
		}
		answered := s.answered
		s.mu.Unlock()
		if !waiting {
			return nil
		}
		select {
		case <-answered:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var errTooLong = errors.New("request line too long")

// readLine reads up to and including the first newline, at most max bytes.
func readLine(r io.Reader, max int) (string, error) {
	buf := make([]byte, 0, max)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			return string(buf[:i+1]), nil
		}
		if len(buf) == cap(buf) {
			return "", errTooLong
		}
		if err != nil {
			return "", err
		}
	}
}

// Close stops every Serve, closes the connections being served and waits
// until they and the Serve calls have returned. It always returns nil.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// track registers a listener or a connection for Close, which waits until
// its untrack; false once closed.
func (s *Server) track(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.open[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c io.Closer) {
	s.mu.Lock()
	delete(s.open, c)
	s.mu.Unlock()
	s.wg.Done()
}
