package agentcheck

import (
	"bytes"
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
}

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
		open: make(map[io.Closer]struct{})}
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
	switch {
	case errors.Is(err, errTooLong):
		answer = refusal(err)
	case err != nil:
		// No newline in time, or the client left: nothing to answer.
		s.log.Debug("agent check without a request line", "remote", c.RemoteAddr().String(), "err", err)
		return
	default:
		req, perr := ParseRequest(line)
		if perr != nil {
			answer = refusal(perr)
		} else {
			st, ok := s.lookup(req.Model)
			answer = Answer(req, st, ok)
		}
	}
	_, _ = io.WriteString(c, answer)
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
