package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/internal/mono"
)

// Server serves HTTP/1.1 to clients with each request's handler run on its
// connection's goroutine, and hands every connection whose next request it
// does not serve itself to a net/http server (Fallback), which then keeps
// it: requests with a Transfer-Encoding (streamed uploads), Expect,
// Upgrade, a head over 4 KiB, obsolete line folding, an absolute or
// asterisk target, a protocol other than HTTP/1.1, or anything it cannot
// parse (net/http then answers the error).
//
// net/http's server starts a goroutine per request to watch the client's
// connection (its background read) and hands off to it and back; on a
// proxy's hot path that costs more than the forwarding itself
// (docs/bench.md). This server watches only requests still running after
// watchAfter (a sweep every watchAfter while requests run), so a client
// that leaves is noticed within twice that, not at once; requests that
// end sooner cost no goroutine, timer or syscall for it.
type Server struct {
	// Handler serves every request, on its connection's goroutine.
	Handler http.Handler
	// Fallback serves the connections handed over. Its Handler should be
	// Handler. It is started by the first Serve and shut down with this
	// server.
	Fallback *http.Server
	// BaseContext is every request's parent context (nil: Background).
	BaseContext context.Context
	// ReadHeaderTimeout bounds reading a request's head once its first
	// byte came, and the wait for a new connection's first request;
	// IdleTimeout bounds the wait for that byte between requests. Zero:
	// none.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// DisableKeepAlives closes every connection after one response.
	DisableKeepAlives bool
	// Log receives handler panics (nil: slog.Default()).
	Log *slog.Logger

	mu        sync.Mutex
	conns     map[*serverConn]struct{}
	listeners map[net.Listener]struct{}
	fallback  *chanListener
	fbOnce    sync.Once
	shutting  atomic.Bool

	active   atomic.Int64 // requests running
	started  atomic.Int64 // requests begun, ever: the sweep's sign of life
	rounds   atomic.Int64 // the sweep's, ever
	sweeping atomic.Bool
}

// Bounds of the server's own buffers and waits.
const (
	// bufSize is each connection's read and write buffer; a request head
	// must fit the read buffer, or the connection goes to Fallback.
	bufSize = 4 << 10
	// pendingMax is the most of an answer of unknown length held back to
	// send it with a Content-Length instead of chunked (net/http: 2 KiB).
	pendingMax = 2 << 10
	// maxDiscard is the most of a request body left unread by its handler
	// that is read and dropped to keep the connection (net/http: 256 KiB).
	maxDiscard = 256 << 10
)

// watchAfter is how long a request runs before its connection is watched
// for the client leaving; a variable so tests can shorten it.
var watchAfter = 20 * time.Millisecond

// Serve accepts connections on l until it fails or the server is shut
// down (http.ErrServerClosed).
func (s *Server) Serve(l net.Listener) error {
	s.fbOnce.Do(func() {
		s.mu.Lock()
		s.fallback = &chanListener{addr: l.Addr(), ch: make(chan net.Conn), done: make(chan struct{})}
		s.mu.Unlock()
		if s.Fallback != nil {
			go func() { _ = s.Fallback.Serve(s.fallback) }()
		}
	})
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		_ = l.Close()
		return http.ErrServerClosed
	}
	if s.listeners == nil {
		s.listeners = make(map[net.Listener]struct{})
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.shutting.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// EMFILE and the like: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := s.newConn(nc)
		if c == nil {
			continue
		}
		go c.serve()
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// Shutdown stops accepting, closes idle connections and waits for the
// others to finish their request, or for ctx; then it returns ctx's error
// and leaves the rest to Close. Fallback is shut down alike.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutting.Store(true)
	s.closeListeners()
	fbErr := make(chan error, 1)
	go func() {
		if s.Fallback == nil {
			fbErr <- nil
			return
		}
		fbErr <- s.Fallback.Shutdown(ctx)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !s.closeIdle() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return <-fbErr
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.shutting.Store(true)
	s.closeListeners()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.nc.Close()
	}
	s.mu.Unlock()
	if s.Fallback != nil {
		return s.Fallback.Close()
	}
	return nil
}

func (s *Server) closeListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l := range s.listeners {
		_ = l.Close()
	}
	if s.fallback != nil {
		s.fallback.close()
	}
}

// closeIdle closes the connections waiting for a request and reports
// whether none is left.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for c := range s.conns {
		// A new connection is given newGrace to send its first request,
		// as net/http gives it: it may have been sent already, and closed
		// unread the client would get no answer at all.
		if c.state.CompareAndSwap(stateIdle, stateClosed) ||
			now.Sub(c.accepted) >= newGrace && c.state.CompareAndSwap(stateNew, stateClosed) {
			_ = c.nc.Close()
		}
	}
	return len(s.conns) == 0
}

func (s *Server) logger() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// Connection states: new until its first request (Shutdown closes it only
// after newGrace), idle between requests (Shutdown closes it), active while
// a request is read or served.
const (
	stateNew int32 = iota
	stateIdle
	stateActive
	stateClosed
)

// newGrace is how long Shutdown waits for a new connection's first
// request (net/http: 5 s).
const newGrace = 5 * time.Second

// serverConn is one client connection. Only its goroutine reads it, except
// the background read of a request watched for the client leaving.
type serverConn struct {
	s   *Server
	nc  net.Conn
	rw  io.ReadWriter // nc's reads and writes: a sockIO when nc has a socket
	cr  connReader
	br  *bufio.Reader
	bw  *bufio.Writer
	ctx context.Context // the connection's: BaseContext's values and deadline and net/http's, never done
	// stopBase ends the connection's watch of BaseContext (baseDone);
	// nil when BaseContext never ends.
	stopBase func() bool
	raddr    string
	state    atomic.Int32

	accepted time.Time
	served   bool // a request was: the next is waited for as an idle one's
	lastPost bool // the last request was a POST

	// rd and wd are the connection's read and write deadlines.
	rd, wd deadline
	cw     connWriter

	// begun is the sweep's round the running request started in, plus
	// one (0: none): a request still running a round later has run
	// watchAfter at least. The sweep counts rounds so that each request
	// need not read the clock.
	begun atomic.Int64

	mu       sync.Mutex
	watch    int // watchNone, watchWanted, watchRunning
	bodyDone bool
	aborting bool
	left     bool // the background read saw the client leave
	baseGone bool // BaseContext ended: so does every request's context
	cancel   context.CancelFunc
	watched  chan struct{}
}

const (
	watchNone = iota
	watchWanted
	watchRunning
)

func (s *Server) newConn(nc net.Conn) *serverConn {
	c := &serverConn{s: s, nc: nc, rw: nc, raddr: nc.RemoteAddr().String(), accepted: time.Now()}
	if s := newSockIO(nc); s != nil {
		c.rw = s
	}
	c.cr.c = c
	c.cw.c = c
	c.rd.nc, c.wd.nc, c.wd.write = nc, nc, true
	base := s.BaseContext
	if base == nil {
		base = context.Background()
	}
	if s.Fallback != nil {
		base = context.WithValue(base, http.ServerContextKey, s.Fallback)
	}
	c.ctx = context.WithValue(detached{base}, http.LocalAddrContextKey, nc.LocalAddr())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		_ = nc.Close()
		return nil
	}
	if s.conns == nil {
		s.conns = make(map[*serverConn]struct{})
	}
	s.conns[c] = struct{}{}
	// A request's context ends with BaseContext through one registration
	// per connection (baseDone), not one per request: the context package
	// would enter each request's in BaseContext's set of children, one
	// map shared by every connection, and take it out again.
	if base.Done() != nil {
		c.stopBase = context.AfterFunc(base, c.baseDone)
	}
	return c
}

func (c *serverConn) forget() {
	if c.stopBase != nil {
		c.stopBase()
	}
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
}

// connReader is what the buffered reader reads: first the byte a
// background read took, then the connection.
type connReader struct {
	c      *serverConn
	one    [1]byte
	hasOne bool
}

func (r *connReader) Read(p []byte) (int, error) {
	if r.hasOne && len(p) > 0 {
		r.hasOne = false
		p[0] = r.one[0]
		return 1, nil
	}
	if r.c.left {
		return 0, io.EOF
	}
	r.c.rd.begin()
	defer r.c.rd.end()
	for {
		n, err := r.c.rw.Read(p)
		if err == nil || n > 0 || !r.c.rd.retry(err) {
			return n, err
		}
	}
}

// connWriter is what the write buffer writes to: the connection, with
// the write deadline wanted in place.
type connWriter struct{ c *serverConn }

func (w *connWriter) Write(p []byte) (int, error) {
	w.c.wd.begin()
	defer w.c.wd.end()
	done := 0
	for {
		n, err := w.c.rw.Write(p[done:])
		done += n
		if err == nil || !w.c.wd.retry(err) {
			return done, err
		}
	}
}

// deadline is one direction's deadline of a connection, put in place
// only when the connection is read (written): a SetDeadline takes the
// descriptor's lock and moves a runtime timer, and most deadlines a
// request wants never bound any I/O (the head's, for a head that came
// whole; a handler's, for a body already buffered or an answer not yet
// flushed; the lifting of either). While the connection is read
// (written), a new deadline is put in place at once: it bounds the
// I/O in progress, as net.Conn's do. A later one than that in place may
// be left for the I/O to reach the earlier one first (put, retry).
// Either way the I/O sees the same deadline it would have seen set at
// once.
type deadline struct {
	nc    net.Conn
	write bool

	mu     sync.Mutex
	wanted time.Time
	set    time.Time    // in place on nc
	busy   atomic.Int32 // I/O in progress; raised under mu
}

// lazySlack: a deadline wanted later than the one in place, by less than
// this, or none wanted, leaves that one in place (see put).
const lazySlack = time.Second

// to wants t as the deadline (zero: none).
func (d *deadline) to(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.wanted = t
	if d.busy.Load() > 0 {
		return d.put()
	}
	return nil
}

// at puts t in place at once, for I/O that does not go through begin
// and end.
func (d *deadline) at(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.wanted = t
	_ = d.place()
}

// begin and end enclose I/O on nc. end takes no lock: a deadline wanted
// as the I/O ends may then be put in place at once, as net.Conn's is.
func (d *deadline) begin() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.busy.Add(1)
	// An error leaves the I/O to fail on its own (a closed connection).
	_ = d.put()
}

func (d *deadline) end() { d.busy.Add(-1) }

// put sets the wanted deadline on nc unless it is in place, or it is
// later than the one in place by less than lazySlack, or none: each
// request wants later deadlines than the last (the idle wait's, a
// handler's), and the one in place is then left until the I/O reaches
// it, which retry then puts the wanted one in place for. d.mu is held.
func (d *deadline) put() error {
	if !d.set.IsZero() && (d.wanted.IsZero() || d.wanted.After(d.set) && d.wanted.Sub(d.set) < lazySlack) {
		return nil
	}
	return d.place()
}

// retry reports whether I/O that failed with err reached the earlier
// deadline put left in place, not the wanted one, which it then puts in
// place: the I/O is to be done again.
func (d *deadline) retry(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.wanted.Equal(d.set) || !d.wanted.IsZero() && !time.Now().Before(d.wanted) {
		return false // the wanted one passed
	}
	return d.place() == nil
}

// place sets the wanted deadline on nc unless it is in place; d.mu is
// held.
func (d *deadline) place() error {
	if d.wanted.Equal(d.set) {
		return nil
	}
	var err error
	if d.write {
		err = d.nc.SetWriteDeadline(d.wanted)
	} else {
		err = d.nc.SetReadDeadline(d.wanted)
	}
	if err == nil {
		d.set = d.wanted
	}
	return err
}

func (c *serverConn) serve() {
	c.br = bufio.NewReaderSize(&c.cr, bufSize)
	for {
		ex, ok := c.next()
		if !ok {
			return
		}
		if ex == nil {
			c.handOff()
			return
		}
		if keep, unread := c.serveOne(ex); !keep {
			if unread {
				c.linger()
			}
			c.close()
			return
		}
	}
}

func (c *serverConn) close() {
	c.state.Store(stateClosed)
	_ = c.nc.Close()
	c.forget()
}

// next waits for a request and reads its head. It returns nil and true
// for a request the Fallback must read, and false when the connection is
// done (closed, timed out, shut down).
func (c *serverConn) next() (*exchange, bool) {
	s := c.s
	// A new connection's first request is waited for as net/http waits:
	// for the ReadHeaderTimeout, not as long as an idle one's next.
	wait := s.IdleTimeout
	if s.ReadHeaderTimeout > 0 && (wait == 0 || !c.served) {
		wait = s.ReadHeaderTimeout
	}
	if wait > 0 {
		_ = c.rd.to(mono.Time(mono.Now() + wait))
	}
	if _, err := c.br.Peek(1); err != nil {
		c.close()
		return nil, false
	}
	if !c.state.CompareAndSwap(stateIdle, stateActive) && !c.state.CompareAndSwap(stateNew, stateActive) {
		c.close() // Shutdown closed it meanwhile
		return nil, false
	}
	bounded := false // the head's own deadline is wanted
	if c.lastPost {
		// Old clients end a POST's body with a CRLF it does not count;
		// net/http skips it, as RFC 9112 allows.
		if c.br.Buffered() < 4 {
			c.boundHead(&bounded)
		}
		peek, _ := c.br.Peek(4)
		n := 0
		for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
			n++
		}
		_, _ = c.br.Discard(n)
	}
	var head []byte
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if i := bytes.Index(buf, []byte("\r\n\r\n")); i >= 0 {
			head = buf[:i+4]
			break
		}
		if c.br.Buffered() == bufSize || bareLF(buf) {
			return nil, true // too large, or lines net/http reads and this server does not
		}
		c.boundHead(&bounded)
		if _, err := c.br.Peek(c.br.Buffered() + 1); err != nil {
			if c.br.Buffered() > 0 && !isTimeout(err) {
				return nil, true // let net/http answer what it makes of it
			}
			c.close()
			return nil, false
		}
	}
	_ = c.rd.to(time.Time{})
	ex, ok := c.parse(head)
	if !ok {
		return nil, true
	}
	_, _ = c.br.Discard(len(head))
	return ex, true
}

// boundHead wants the head's own deadline once, before the head is read
// further than the bytes its first read brought (a head that came whole
// needs none): ReadHeaderTimeout from then, or none with only an
// IdleTimeout, whose deadline does not bound the head (nor does
// net/http's).
func (c *serverConn) boundHead(bounded *bool) {
	if *bounded {
		return
	}
	*bounded = true
	if t := c.s.ReadHeaderTimeout; t > 0 {
		_ = c.rd.to(mono.Time(mono.Now() + t))
	} else {
		_ = c.rd.to(time.Time{})
	}
}

// validHost: a Host net/http serves (httpguts.ValidHostHeader), not
// empty; net/http answers 400 to the others.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!$%&'()*+,-.:;=[]_~", c) >= 0) {
			return false
		}
	}
	return h != ""
}

// bareLF reports whether b has a line feed without a carriage return
// before it.
func bareLF(b []byte) bool {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return false
		}
		if i+j == 0 || b[i+j-1] != '\r' {
			return true
		}
		i += j + 1
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// exchange is what the Server makes for one request, in one allocation
// besides its head, header, request and context: its URL, body, response
// writer and header values.
//
// The context is context.WithCancel's: one of the server's own type
// would be cheaper, but the context package recognises only its own as
// a parent through the values wrapped around it (the gateway's), and
// would start a goroutine for each child of another.
type exchange struct {
	req    *http.Request
	cancel context.CancelFunc // the request's context's
	url    url.URL
	body   reqBody // unused without a body
	w      response
	values [requestValues]string // the header's, when they fit
}

// requestValues is the most header values a request holds in its
// exchange (Go's client sends 4, SDKs with their telemetry headers more);
// a longer header has an array of its own.
const requestValues = 20

// parse reads a request head this server serves; false for any other.
// Every string of the request is a piece of one copy of the head, and
// the header's values share one backing array.
func (c *serverConn) parse(raw []byte) (*exchange, bool) {
	head := string(raw[:len(raw)-2])
	line, rest, _ := strings.Cut(head, "\r\n")
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !validName(method) || !strings.HasPrefix(target, "/") ||
		!printable(target) || strings.IndexByte(target, '#') >= 0 {
		return nil, false
	}
	var u url.URL
	if !requestURL(&u, target) {
		return nil, false
	}
	lines := strings.Count(rest, "\n") // one byte counts faster than two
	ex := &exchange{url: u}
	h := make(http.Header, max(lines-1, 0)) // Host is not in it
	values := ex.values[:0]
	if lines > len(ex.values) {
		values = make([]string, 0, lines)
	}
	host, hosts := "", 0
	cl := int64(0)
	hasCL, clAt := false, 0
	closeReq := false
	for rest != "" {
		// Lines end in CRLF: a bare LF is refused.
		i := strings.IndexByte(rest, '\n')
		if i < 1 || rest[i-1] != '\r' {
			return nil, false
		}
		kv := rest[:i-1]
		rest = rest[i+1:]
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, ":")
		if !ok || kv[0] == ' ' || kv[0] == '\t' {
			return nil, false
		}
		if k, ok = canonicalToken(k); !ok {
			return nil, false
		}
		v = trimOWS(v)
		if !validValue(v) {
			return nil, false
		}
		switch k {
		case "Host":
			host, hosts = v, hosts+1
			continue
		case "Transfer-Encoding", "Expect", "Upgrade", "Te", "Http2-Settings":
			return nil, false
		case "Content-Length":
			// As net/http: digits only, and repeats must be the same
			// text, kept once.
			if hasCL {
				if v != values[clAt] {
					return nil, false
				}
				continue
			}
			n, err := strconv.ParseUint(v, 10, 63)
			if err != nil {
				return nil, false
			}
			cl, hasCL, clAt = int64(n), true, len(values)
		case "Connection":
			for tok := range strings.SplitSeq(v, ",") {
				switch {
				case asciiEqualFold(trimOWS(tok), "close"):
					closeReq = true
				case asciiEqualFold(trimOWS(tok), "upgrade"):
					return nil, false
				}
			}
		}
		values = append(values, v)
		if vv := h[k]; vv != nil {
			h[k] = append(vv, v)
		} else {
			h[k] = values[len(values)-1 : len(values) : len(values)]
		}
	}
	if hosts != 1 || !validHost(host) {
		return nil, false
	}
	pragmaNoCache(HeaderFields(h))
	var body io.ReadCloser = http.NoBody
	c.bodyDone = true
	if cl > 0 {
		ex.body.c, ex.body.left = c, cl
		body = &ex.body
		c.bodyDone = false
	}
	r := http.Request{
		Method:        method,
		URL:           &ex.url,
		Proto:         proto,
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          body,
		ContentLength: cl,
		Host:          host,
		Close:         closeReq,
		RemoteAddr:    c.raddr,
		RequestURI:    target,
	}
	ctx, cancel := context.WithCancel(c.ctx)
	ex.req, ex.cancel = r.WithContext(ctx), cancel
	return ex, true
}

// requestURL sets u to url.ParseRequestURI(target) for an origin-form
// target, which most are: one whose path needs no unescaping (nor
// escaping back) is cut into Path and RawQuery as ParseRequestURI would,
// with no allocation; another is left to it. false: it refuses target.
func requestURL(u *url.URL, target string) bool {
	path, query, hasQuery := strings.Cut(target, "?")
	plain := true
	for i := 0; i < len(path) && plain; i++ {
		c := path[i]
		plain = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("$&+,-./:;=@_~", c) >= 0
	}
	if plain {
		// "/a?" has ForceQuery, "/a??" a RawQuery of "?".
		*u = url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
		return true
	}
	p, err := url.ParseRequestURI(target)
	if err != nil {
		return false
	}
	*u = *p
	return true
}

// handOff gives the connection, with what was read of it, to Fallback.
func (c *serverConn) handOff() {
	c.forget()
	// Fallback sets the deadlines it wants on the connection itself.
	c.rd.at(time.Time{})
	c.wd.at(time.Time{})
	buffered, _ := c.br.Peek(c.br.Buffered())
	hc := &handedConn{Conn: c.nc, r: io.MultiReader(bytes.NewReader(bytes.Clone(buffered)), &c.cr)}
	if c.s.Fallback == nil || !c.s.fallback.give(hc) {
		_ = c.nc.Close()
	}
}

// handedConn is a connection handed to Fallback: what this server read
// of it comes first.
type handedConn struct {
	net.Conn
	r io.Reader
}

func (h *handedConn) Read(p []byte) (int, error) { return h.r.Read(p) }

// CloseWrite lets net/http half-close the connection before it closes it
// after an answer to a body it did not read whole: without, unread bytes
// make the close a reset, which can destroy the answer before the client
// reads it.
func (h *handedConn) CloseWrite() error { return closeWrite(h.Conn) }

// closeWrite half-closes c when it can (a TCP connection, or one that
// passes the call on).
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serveOne runs the handler for r and finishes its response; it reports
// whether the connection serves another request, and whether the client
// may still be sending a body nobody read.
func (c *serverConn) serveOne(ex *exchange) (keep, unread bool) {
	s := c.s
	r := ex.req
	// The body as parsed: the handler may replace r.Body, or hand it to a
	// goroutine that outlives it.
	var body *reqBody
	if ex.body.c != nil {
		body = &ex.body
	}
	c.served, c.lastPost = true, r.Method == http.MethodPost
	w := &ex.w
	w.c, w.req, w.cl = c, r, -1 // the header when asked for: Header
	c.mu.Lock()
	c.cancel = ex.cancel
	gone := c.baseGone
	c.mu.Unlock()
	if gone {
		ex.cancel()
	}
	c.begun.Store(s.rounds.Load() + 1)
	s.active.Add(1)
	s.started.Add(1)
	if !s.sweeping.Load() && s.sweeping.CompareAndSwap(false, true) {
		go s.sweep()
	}
	panicked := c.handle(w, r)
	s.active.Add(-1)
	c.endWatch()
	ex.cancel()
	if panicked {
		// What was written goes out, unfinished: the client sees the
		// answer cut, not ended.
		w.err = errPanicked
		w.finish()
		if body != nil {
			body.end(false)
		}
		return false, false
	}
	w.finish()
	// A handler's deadlines end with the request, as net/http's do: the
	// next one would fail at them.
	if w.readDeadline {
		_ = c.rd.to(time.Time{})
	}
	if w.writeDeadline {
		_ = c.wd.to(time.Time{})
	}
	if body != nil && !body.end(!w.closeAfter) {
		w.closeAfter, unread = true, true
	}
	c.bodyDone = false
	c.state.Store(stateIdle)
	return !w.closeAfter && w.err == nil && !c.left, unread && w.err == nil
}

var errPanicked = errors.New("h1: the handler panicked")

// handle runs the handler; a panic ends the connection, and one other
// than http.ErrAbortHandler (a proxy's way to cut an answer) is logged.
func (c *serverConn) handle(w http.ResponseWriter, r *http.Request) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			if v != http.ErrAbortHandler {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.logger().Error("panic serving a request", "remote", c.raddr, "panic", fmt.Sprint(v), "stack", string(buf))
			}
		}
	}()
	c.s.Handler.ServeHTTP(w, r)
	return false
}

// sweep arms the watch of requests running longer than watchAfter; it
// runs while requests do, and stops after two quiet rounds.
func (s *Server) sweep() {
	tick := time.NewTicker(watchAfter)
	defer tick.Stop()
	quiet, seen := 0, s.started.Load()
	for range tick.C {
		// Requests begun before the last round have run watchAfter.
		round := s.rounds.Add(1)
		s.mu.Lock()
		for c := range s.conns {
			if b := c.begun.Load(); b != 0 && b < round {
				c.arm()
			}
		}
		s.mu.Unlock()
		started := s.started.Load()
		if s.active.Load() > 0 || started != seen {
			quiet, seen = 0, started
			continue
		}
		if quiet++; quiet < 2 {
			continue
		}
		s.sweeping.Store(false)
		// A request that began as the flag went down started no sweep.
		if s.active.Load() == 0 || !s.sweeping.CompareAndSwap(false, true) {
			return
		}
		quiet = 0
	}
}

// arm starts watching the connection for the client leaving, once the
// request's body is read (before, the handler reads the connection).
func (c *serverConn) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watch != watchNone || c.cancel == nil {
		return
	}
	if !c.bodyDone {
		c.watch = watchWanted
		return
	}
	c.startWatch()
}

// startWatch starts the background read; c.mu is held.
func (c *serverConn) startWatch() {
	c.watch = watchRunning
	c.watched = make(chan struct{})
	go c.backgroundRead(c.cancel, c.watched)
}

// bodyRead is called when the request's body was read to its end.
func (c *serverConn) bodyRead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bodyDone = true
	if c.watch == watchWanted {
		c.startWatch()
	}
}

// backgroundRead waits for the client's next byte: a pipelined request's
// first (kept for the next read), or the end of the connection, which
// cancels the request.
func (c *serverConn) backgroundRead(cancel context.CancelFunc, done chan struct{}) {
	defer close(done)
	c.rd.begin()
	n, err := c.nc.Read(c.cr.one[:])
	for n == 0 && err != nil && c.rd.retry(err) {
		n, err = c.nc.Read(c.cr.one[:])
	}
	c.rd.end()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case n == 1:
		c.cr.hasOne = true
	case c.aborting:
	case err != nil:
		c.left = true
		cancel()
	}
}

// detached is BaseContext's values and deadline without its end, which
// reaches requests through baseDone.
type detached struct{ context.Context }

func (detached) Done() <-chan struct{} { return nil }
func (detached) Err() error            { return nil }

// baseDone cancels the request under way, and the next ones, when
// BaseContext ends.
func (c *serverConn) baseDone() {
	c.mu.Lock()
	c.baseGone = true
	cancel := c.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// endWatch stops the background read, if one runs, before the connection
// is read or written again.
func (c *serverConn) endWatch() {
	c.begun.Store(0)
	c.mu.Lock()
	running := c.watch == watchRunning
	done := c.watched
	c.aborting = running
	c.watch = watchNone
	c.cancel = nil
	c.mu.Unlock()
	if !running {
		return
	}
	_ = c.rd.to(stopped)
	<-done
	_ = c.rd.to(time.Time{})
	c.mu.Lock()
	c.aborting = false
	c.mu.Unlock()
}

// Bounds of linger.
const (
	lingerFor  = 500 * time.Millisecond
	lingerMost = 8 << 20
)

// linger lets a client still sending a body nobody read (an upload
// answered 413) read its answer: closed at once with bytes unread, the
// connection would be reset, and the client could lose the answer with
// it. The write side is closed first, then what comes is read and dropped
// for a while (net/http waits 500 ms the same way).
func (c *serverConn) linger() {
	_ = closeWrite(c.nc)
	c.rd.at(time.Now().Add(lingerFor))
	_, _ = io.CopyN(io.Discard, c.nc, lingerMost)
}

// reqBody is a request body of known length, read from the connection's
// buffer.
type reqBody struct {
	c *serverConn
	// mu: a handler may pass the body to a goroutine (a RoundTripper's)
	// that reads or closes it while, or after, the handler returns.
	mu     sync.Mutex
	left   int64
	closed bool // by the handler, or by the server once it returned
	err    error
}

func (b *reqBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return 0, http.ErrBodyReadAfterClose
	case b.err != nil:
		return 0, b.err
	case b.left == 0:
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.c.br.Read(p)
	b.left -= int64(n)
	if b.left == 0 {
		b.c.bodyRead()
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *reqBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// end takes the body back from the handler, which returned: later reads
// fail, as net/http's do, instead of reading the next request. With
// discard, it reads what the handler left of the body, if it is little
// and comes at once. false: the connection cannot serve another request.
func (b *reqBody) end(discard bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.left == 0 {
		return true
	}
	if !discard || b.err != nil || b.left > maxDiscard {
		return false
	}
	_ = b.c.rd.to(time.Now().Add(time.Second))
	defer func() { _ = b.c.rd.to(time.Time{}) }()
	n, err := b.c.br.Discard(int(b.left))
	b.left -= int64(n)
	return err == nil
}

// chanListener is the Fallback's listener: connections handed over.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) give(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) close()         { l.once.Do(func() { close(l.done) }) }
func (l *chanListener) Close() error   { l.close(); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }
