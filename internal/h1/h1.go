// Package h1 is napd's HTTP/1.1 client to one engine on loopback: the
// request is written and the answer read on the caller's goroutine, over
// pooled keep-alive connections, with no goroutine per connection.
//
// net/http's Transport gives every connection a read loop and a write
// loop goroutine and hands each request to them and back; on a proxy's
// hot path those hand-offs, and the read loop's read that parks before
// the answer is there, cost more than the forwarding itself
// (docs/bench.md). Requests it does not do as well as net/http's
// Transport go to one: a body that streams in (unknown length, or not in
// memory) and protocol upgrades.
package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/napd/napd/internal/mono"
)

// Defaults for a Transport's zero fields.
const (
	defaultMaxIdle     = 1024
	defaultIdleTimeout = 90 * time.Second
	// inline bounds a body sent in the head's write.
	inline = 64 << 10
)

// Transport is an http.RoundTripper to engines over HTTP/1.1 on plain
// TCP. Its zero value works with net.Dialer's defaults.
type Transport struct {
	// Dial opens a connection; nil is a plain net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxIdle bounds the idle connections kept (0: 1024); IdleTimeout is
	// how long one is kept (0: 90 s).
	MaxIdle     int
	IdleTimeout time.Duration
	// Fallback carries what this transport does not; nil: one made from
	// Dial on first use.
	Fallback http.RoundTripper
	// Retired, when set and true, keeps no connection idle any more: the
	// engine they reach has gone (connections of requests that were in
	// flight then are closed as they end).
	Retired func() bool

	mu       sync.Mutex
	idle     []*conn // most recently used last
	flight   []*conn // those of requests in flight, for the sweep
	sweeping bool    // a sweep runs
	fallback http.RoundTripper
	clock    func() time.Time // nil: the monotonic clock's; tests set it
}

// now is a reading for idle times: the monotonic clock's alone (time.Now
// reads the wall clock too).
func (t *Transport) now() time.Time {
	if t.clock != nil {
		return t.clock()
	}
	return mono.Time(mono.Now())
}

// conn is one keep-alive connection. Only the request holding it uses it.
type conn struct {
	nc    net.Conn
	raw   syscall.RawConn       // nc's, for the peek before each reuse; nil: none
	peek  func(fd uintptr) bool // c.peekFd, made once
	alive bool                  // what the last peek saw
	pb    [1]byte               // the peek's buffer
	rw    io.ReadWriter         // nc's reads and writes: a sockIO when nc has a socket
	lr    *limitedConn          // under br: bounds the answer's head
	br    *bufio.Reader
	used  time.Time // when it was put back idle
	reuse bool      // it served a request before
	// ctx is the context of the request in flight on c, at t.flight[slot]
	// (slot -1: not there); cancelled, the sweep fails the read or write
	// the request waits in and marks c stopped, never to be reused. A
	// request a second sweep finds still running (seen by the first) is
	// registered with its context instead (stop ends the registration)
	// and leaves the flight. Under the Transport's mu.
	ctx     context.Context
	slot    int
	seen    bool
	stopped bool
	stop    func() bool
	unblock func() // fails the read or write under way; made once
}

// maxHead bounds an answer's head, and maxInterim the interim (1xx)
// answers before the final one, as net/http's Transport does (its
// defaults: 10 MB, 5); an engine past them is broken, and its request
// fails (502) rather than napd's memory or time.
const (
	maxHead    = 1 << 20
	maxInterim = 5
)

var (
	errHeadTooLarge = errors.New("h1: the engine's answer head is over 1 MiB")
	errInterim      = errors.New("h1: the engine sent more than 5 interim (1xx) answers")
	errSwitched     = errors.New("h1: the engine switched protocols, and the request asked for no upgrade")
)

// errNothingWritten marks a failure to send on a reused connection before
// any byte of the request went out: safe to try once on a fresh one.
var errNothingWritten = errors.New("h1: nothing written")

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, _, err := t.roundTrip(req, false)
	return resp, err
}

// RoundTripHead is RoundTrip for a proxy that passes the answer on: the
// answer's fields come as a Head, for the Server to take over
// (TakeHead), and its Header is nil. A request this Transport hands to
// net/http's gets its answer as RoundTrip's, with a Header and no Head.
func (t *Transport) RoundTripHead(req *http.Request) (*http.Response, *Head, error) {
	return t.roundTrip(req, true)
}

func (t *Transport) roundTrip(req *http.Request, asHead bool) (*http.Response, *Head, error) {
	if !t.handles(req) {
		resp, err := t.fallbackFor().RoundTrip(req)
		return resp, nil, err
	}
	for try := 0; ; try++ {
		c, err := t.get(req.Context(), req.URL.Host)
		if err != nil {
			return nil, nil, err
		}
		a, err := t.send(c, req, asHead)
		if req.Body != nil {
			// Sent (or failed): closed, as a RoundTripper must (a retry
			// takes a fresh copy from GetBody, or rewinds a MemBody).
			_ = req.Body.Close()
		}
		if err == nil {
			if asHead {
				return &a.resp, &a.head, nil
			}
			return &a.resp, nil, nil
		}
		if errors.Is(err, errNothingWritten) && c.reuse && try == 0 && req.Context().Err() == nil {
			if mb, ok := req.Body.(*MemBody); ok {
				mb.Rewind() // the failed try is over with it
			} else if req.Body != nil && req.Body != http.NoBody {
				body, gerr := req.GetBody()
				if gerr != nil {
					return nil, nil, gerr
				}
				r := *req
				r.Body = body
				req = &r
			}
			continue
		}
		if cerr := req.Context().Err(); cerr != nil {
			return nil, nil, cerr
		}
		return nil, nil, err
	}
}

// handles reports whether req goes over this transport's own connections:
// plain HTTP, a body of known length in memory (GetBody, or a MemBody) or
// none, and no protocol upgrade.
func (t *Transport) handles(req *http.Request) bool {
	if !ownScheme(req.URL) || req.Header.Get("Upgrade") != "" || req.Close {
		return false
	}
	if req.Body == nil || req.Body == http.NoBody {
		return true
	}
	_, mem := req.Body.(*MemBody)
	return (mem || req.GetBody != nil) && req.ContentLength > 0
}

// MemBody is a request body in memory that the Transport knows as such
// without a GetBody (whose closure costs an allocation per request); it
// rewinds it to retry a request. Only for requests this Transport itself
// sends (handles): net/http's Transport retries none without GetBody.
type MemBody struct {
	bytes.Reader
	b []byte
}

// Reset makes b the body, read from its start.
func (m *MemBody) Reset(b []byte) {
	m.b = b
	m.Reader.Reset(b)
}

// Rewind makes the body read from its start again.
func (m *MemBody) Rewind() { m.Reader.Reset(m.b) }

func (*MemBody) Close() error { return nil }

func (t *Transport) fallbackFor() http.RoundTripper {
	if t.Fallback != nil {
		return t.Fallback
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fallback == nil {
		t.fallback = &http.Transport{
			Proxy:               nil,
			DialContext:         t.dial,
			MaxIdleConns:        t.maxIdle(),
			MaxIdleConnsPerHost: t.maxIdle(),
			IdleConnTimeout:     t.idleTimeout(),
			DisableCompression:  true,
		}
	}
	return t.fallback
}

func (t *Transport) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if t.Dial != nil {
		return t.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (t *Transport) maxIdle() int {
	if t.MaxIdle > 0 {
		return t.MaxIdle
	}
	return defaultMaxIdle
}

func (t *Transport) idleTimeout() time.Duration {
	if t.IdleTimeout > 0 {
		return t.IdleTimeout
	}
	return defaultIdleTimeout
}

// get returns an idle connection to addr that is still open, or a new one.
// Every connection of a Transport goes to one engine, so addr only matters
// for dialing.
func (t *Transport) get(ctx context.Context, addr string) (*conn, error) {
	now := t.now()
	for {
		t.mu.Lock()
		n := len(t.idle)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		c := t.idle[n-1]
		t.idle[n-1] = nil
		t.idle = t.idle[:n-1]
		t.mu.Unlock()
		// Every reuse is checked with a non-blocking peek (one syscall,
		// about a microsecond): a connection the engine closed, or one
		// with bytes nobody asked for (which would be read as the next
		// request's answer: another client's), is not reused.
		if now.Sub(c.used) < t.idleTimeout() && c.open() {
			return c, nil
		}
		c.nc.Close()
	}
	nc, err := t.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &conn{nc: nc, rw: nc, slot: -1}
	if s := newSockIO(nc); s != nil {
		c.rw = s
	}
	c.lr = &limitedConn{r: c.rw, left: -1}
	c.unblock = func() { _ = nc.SetDeadline(stopped) }
	c.br = bufio.NewReaderSize(c.lr, 4<<10)
	// Made once: SyscallConn allocates a RawConn at each call, and a
	// closure made for each peek would be allocated too.
	if sc, ok := nc.(syscall.Conn); ok {
		if c.raw, err = sc.SyscallConn(); err != nil {
			nc.Close()
			return nil, err
		}
		c.peek = c.peekFd
	}
	return c, nil
}

// limitedConn fails reads past left bytes while left ≥ 0: an engine's
// answer head may not grow without bound in napd's memory.
type limitedConn struct {
	r    io.Reader
	left int64 // -1: no bound
}

func (l *limitedConn) Read(p []byte) (int, error) {
	if l.left < 0 {
		return l.r.Read(p)
	}
	if l.left == 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// end ends the request in flight on c. With keep, c is kept for the next
// request, unless enough are kept or the request was cancelled (the sweep
// may have stopped c); without, or else, it is closed.
func (t *Transport) end(c *conn, keep bool) {
	var now time.Time
	if keep {
		now = t.now()
	}
	t.mu.Lock()
	// A request cancelled since the last sweep is not kept either, nor
	// one whose registration ran (its deadline may be set any moment).
	cancelled := c.ctx.Err() != nil
	keep = t.unwatch(c) && keep && !cancelled
	if !keep {
		t.mu.Unlock()
		c.nc.Close()
		return
	}
	c.used, c.reuse = now, true
	// Those idle past the timeout go first, oldest at the bottom: get takes
	// from the top, so under steady load the connections a burst left below
	// would never be looked at again and would stay open for good (in
	// CLOSE_WAIT once the engine closed its end) instead of IdleTimeout.
	var stale []*conn
	k := 0
	for k < len(t.idle) && now.Sub(t.idle[k].used) >= t.idleTimeout() {
		k++
	}
	if k > 0 {
		stale = slices.Clone(t.idle[:k])
		t.idle = slices.Delete(t.idle, 0, k)
	}
	if len(t.idle) < t.maxIdle() && (t.Retired == nil || !t.Retired()) {
		t.idle = append(t.idle, c)
		c = nil
	}
	t.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
	for _, s := range stale {
		s.nc.Close()
	}
}

// CloseIdleConnections closes the connections kept idle, and the
// fallback's.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	fb := t.fallback
	t.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
	if fb, ok := fb.(interface{ CloseIdleConnections() }); ok {
		fb.CloseIdleConnections()
	}
	if fb, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		fb.CloseIdleConnections()
	}
}

// open reports whether an idle connection is still open: nothing to read
// (a peek that would block). A closed one reads EOF; one with bytes
// waiting is out of step and is not reused either. Without a RawConn
// (a Dial's own kind of net.Conn) there is nothing to peek with.
func (c *conn) open() bool {
	if c.raw == nil {
		return true
	}
	c.alive = false
	err := c.raw.Read(c.peek)
	return err == nil && c.alive
}

// peekFd is open's peek at the connection's socket.
func (c *conn) peekFd(fd uintptr) bool {
	c.alive = sysPeek(fd, c.pb[:]) == syscall.EAGAIN
	return true // never wait: the answer is now
}

// stopped is a time long past: a deadline set to it fails the blocked
// read or write at once.
var stopped = time.Unix(1, 0)

// cancelSweep is how often the requests in flight are looked at for a
// cancelled context.
const cancelSweep = 10 * time.Millisecond

// watch puts the request on c, with its context, among those the sweep
// looks at; end takes it out. Registering every request with its context
// (context.AfterFunc) cost five allocations per request, while nearly all
// of them end before a sweep sees them; those two sweeps find running
// (streams, long answers) are registered then, and looked at no more, so
// a sweep costs in proportion to the requests begun in its last two
// rounds, not to those open.
func (t *Transport) watch(c *conn, ctx context.Context) {
	t.mu.Lock()
	c.ctx, c.slot, c.seen = ctx, len(t.flight), false
	t.flight = append(t.flight, c)
	if !t.sweeping {
		t.sweeping = true
		go t.sweep()
	}
	t.mu.Unlock()
}

// unwatch ends the watch of c's request, and reports whether c may be
// reused: false when the sweep stopped it or its registration ran; t.mu is
// held.
func (t *Transport) unwatch(c *conn) bool {
	reuse := !c.stopped
	t.unlist(c)
	if c.stop != nil {
		reuse = c.stop() && reuse
		c.stop = nil
	}
	c.ctx = nil
	return reuse
}

// unlist takes c out of the flight; t.mu is held.
func (t *Transport) unlist(c *conn) {
	if i := c.slot; i >= 0 {
		last := len(t.flight) - 1
		t.flight[i] = t.flight[last]
		t.flight[i].slot = i
		t.flight[last] = nil
		t.flight = t.flight[:last]
	}
	c.slot = -1
}

// sweep fails, every cancelSweep, the read or write each cancelled request
// waits in, and registers those it saw running in its last round too with
// their context (which fails it as the context ends): a cancelled request
// ends within cancelSweep, and its connection is not reused. Registering
// at the first sight would register every request that straddles a
// round (a fifth of them at 2 ms each); at the second, only those that
// ran for a whole round. It runs while requests are in flight, and stops
// after two rounds without any.
func (t *Transport) sweep() {
	tick := time.NewTicker(cancelSweep)
	defer tick.Stop()
	var cancelled []*conn
	for quiet := 0; quiet < 2; {
		<-tick.C
		t.mu.Lock()
		for i := 0; i < len(t.flight); {
			c := t.flight[i]
			err := c.ctx.Err()
			if err == nil && !c.seen {
				c.seen = true
				i++
				continue
			}
			t.unlist(c) // the last one takes its place at i
			if err == nil {
				c.stop = context.AfterFunc(c.ctx, c.unblock)
				continue
			}
			c.stopped = true
			cancelled = append(cancelled, c)
		}
		if quiet++; len(t.flight) > 0 {
			quiet = 0
		}
		if quiet == 2 {
			t.sweeping = false
		}
		t.mu.Unlock()
		// Out of the lock: a stopped connection is never reused, so a
		// deadline set after its request ended touches no other request.
		for i, c := range cancelled {
			_ = c.nc.SetDeadline(stopped)
			cancelled[i] = nil
		}
		cancelled = cancelled[:0]
	}
}

// SendsItself reports whether rt is a Transport that sends a request to u
// over its own connections when the request is plain (handles: no
// Upgrade or Close, a MemBody or no body), rather than handing it to
// net/http's Transport. Such a request needs nothing only net/http's
// Transport uses (GetBody, a client trace: this one drops 1xx answers).
func SendsItself(rt http.RoundTripper, u *url.URL) bool {
	_, ok := rt.(*Transport)
	return ok && ownScheme(u)
}

// ownScheme reports whether requests to u may go over the Transport's own
// connections: plain HTTP (TLS and unix sockets go to net/http's).
func ownScheme(u *url.URL) bool { return u.Scheme == "http" }

// heads are the buffers requests' heads and small bodies are written from.
var heads = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// send writes req on c and reads the answer's head (asHead: as a Head).
// On error c is closed.
func (t *Transport) send(c *conn, req *http.Request, asHead bool) (*answer, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		c.nc.Close()
		return nil, err
	}
	// A cancelled request (client gone, deadline) unblocks whatever read
	// or write it waits in; the connection is not reused after.
	t.watch(c, ctx)
	bp := heads.Get().(*[]byte)
	buf, err := appendHead((*bp)[:0], req)
	if err == nil && req.ContentLength > 0 && req.ContentLength <= inline {
		buf, err = appendBody(buf, req.Body, req.ContentLength)
	}
	if err != nil {
		*bp = buf[:0]
		heads.Put(bp)
		t.end(c, false)
		return nil, fmt.Errorf("h1: %w", err)
	}
	n, err := c.rw.Write(buf)
	*bp = buf[:0]
	heads.Put(bp)
	if err == nil && req.ContentLength > inline {
		_, err = io.CopyN(c.nc, req.Body, req.ContentLength)
	}
	if err != nil {
		t.end(c, false)
		if n == 0 {
			return nil, fmt.Errorf("%w: %w", errNothingWritten, err)
		}
		return nil, err
	}
	var a *answer
	for interim := 0; ; interim++ {
		c.lr.left = maxHead // the head is bounded; the body is the proxy's to stream
		a, err = readAnswer(c.br, req, asHead)
		c.lr.left = -1
		if err == nil && a.resp.StatusCode < 200 && a.resp.StatusCode != http.StatusSwitchingProtocols && interim == maxInterim {
			err = errInterim
		}
		if err != nil {
			t.end(c, false)
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the engine closed before answering
			}
			return nil, err
		}
		// 1xx answers other than 101 are interim; the final one follows.
		if a.resp.StatusCode >= 200 || a.resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	resp := &a.resp
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// No request here asks for an upgrade (those go to the fallback):
		// the engine's 101 is an error. Handed on, ReverseProxy would
		// refuse it without closing its body, so the connection would
		// stay open.
		t.end(c, false)
		return nil, errSwitched
	}
	a.tb = body{rc: resp.Body, t: t, c: c, ctx: ctx,
		keep: !resp.Close && !req.Close}
	resp.Body = &a.tb
	return a, nil
}

// appendHead appends req's request line and header as HTTP/1.1.
func appendHead(b []byte, req *http.Request) ([]byte, error) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	uri := req.URL.RequestURI()
	if !validName(req.Method) || !printable(uri) || !printable(host) {
		return b, fmt.Errorf("invalid request line %q %q (host %q)", req.Method, uri, host)
	}
	b = append(b, req.Method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	for k, vs := range req.Header {
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Trailer":
			continue
		}
		if !validName(k) {
			return b, fmt.Errorf("invalid header name %q", k)
		}
		for _, v := range vs {
			if v == "" && k == "User-Agent" {
				continue // ReverseProxy's way of saying "send none"
			}
			if !validValue(v) {
				return b, fmt.Errorf("invalid value for header %s", k)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	switch {
	case req.ContentLength > 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, req.ContentLength, 10)
		b = append(b, "\r\n"...)
	case req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch:
		b = append(b, "Content-Length: 0\r\n"...)
	}
	return append(b, "\r\n"...), nil
}

// printable: no space or control character, which would end or split
// the request line.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return s != ""
}

// validValue: a header value of visible characters, spaces and tabs
// (RFC 9110's field-value), nothing that would end the line.
func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validName: a header name or a method is a token (RFC 9110).
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !tokenChars[k[i]] {
			return false
		}
	}
	return true
}

// canonicalToken is http.CanonicalHeaderKey(k), and whether k is a token
// (validName), in one pass over k when it is in canonical form already,
// as most names are.
func canonicalToken(k string) (string, bool) {
	if k == "" {
		return "", false
	}
	upper, canonical := true, true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !tokenChars[c] {
			return "", false
		}
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			canonical = false
		}
		upper = c == '-'
	}
	if !canonical {
		return http.CanonicalHeaderKey(k), true
	}
	return k, true
}

// tokenChars marks the bytes of a token: a table costs less than the
// comparisons on every byte of every name.
var tokenChars = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
	}
	return t
}()

// appendBody appends the n bytes of r.
func appendBody(b []byte, r io.Reader, n int64) ([]byte, error) {
	start := len(b)
	b = append(b, make([]byte, n)...)
	if _, err := io.ReadFull(r, b[start:]); err != nil {
		return b, fmt.Errorf("request body: %w", err)
	}
	return b, nil
}

// body is an answer's body: at its end the connection goes back to the
// pool, if it can be reused; closed before its end, it is closed.
type body struct {
	rc   io.ReadCloser
	t    *Transport
	c    *conn
	ctx  context.Context
	keep bool // the connection may serve another request after this answer
	done bool
	// err is what every read after the end returns (nil: io.EOF): the
	// failure that cut the answer, so that reading again never makes a cut
	// answer look complete (net/http's body keeps its error too).
	err error
}

func (b *body) Read(p []byte) (int, error) {
	if b.done {
		if b.err != nil {
			return 0, b.err
		}
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.finish(true)
	case err != nil:
		b.finish(false)
		if cerr := b.ctx.Err(); cerr != nil {
			err = cerr // a cancelled request's read fails with its reason
		}
		b.err = err
	}
	return n, err
}

func (b *body) Close() error {
	if !b.done {
		// An answer with no body is at its end already.
		b.finish(b.rc == http.NoBody)
		if b.rc != http.NoBody {
			b.err = http.ErrBodyReadAfterClose // unfinished: never its end
		}
	}
	return nil
}

// finish ends the answer: the connection is kept when the whole answer was
// read, the engine did not ask to close it, nothing more came, and the
// request was not cancelled meanwhile (its deadline may be set on it).
func (b *body) finish(complete bool) {
	b.done = true
	_ = b.rc.Close()
	b.t.end(b.c, complete && b.keep && b.c.br.Buffered() == 0)
}
