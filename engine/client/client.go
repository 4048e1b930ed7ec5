// Package client is napd's side of the engine transport: it connects to a
// worker's ipc:// address, keeps the session alive with heartbeats, and
// serves HTTP requests through it as an http.RoundTripper, so the gateway's
// reverse proxy reaches a ZMQ worker exactly as it reaches an HTTP engine.
//
// It owns the session (dial, handshake, heartbeats, in-flight requests). It
// must not decide anything about the model's lifecycle: a dead session is
// reported through OnState and the requests it fails, and napd's model loop
// decides.
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/napd/napd/engine"
	"github.com/napd/napd/engine/wire"
)

// Software is the name the client gives in its handshake.
const Software = "napd"

// Options tunes a Client. Zero values take the defaults.
type Options struct {
	// HeartbeatInterval is how often napd asks the worker how it is
	// (default 1s); it is also the pause between reconnection attempts.
	HeartbeatInterval time.Duration
	// DeadAfter is how long the worker may stay silent before it is declared
	// dead (default 5 heartbeat intervals). A worker whose socket closes is
	// declared dead at once.
	DeadAfter time.Duration
	// RetryAfter is the Retry-After of a 503 for a NoRoom refusal (default 1s).
	RetryAfter time.Duration
	// OnState, if set, is called when a session is established (Connected,
	// nil) and when it dies (Dead, the *DeadError). It runs on the client's
	// goroutine and must not block.
	OnState func(State, error)
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = time.Second
	}
	if o.DeadAfter <= 0 {
		o.DeadAfter = 5 * o.HeartbeatInterval
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// State is a session's state, for Options.OnState.
type State int

// Session states.
const (
	Connected State = iota
	Dead
)

func (s State) String() string {
	if s == Connected {
		return "connected"
	}
	return "dead"
}

// DeadError is the error of every request in flight when the worker is
// declared dead, and of requests made while no session is up. The gateway
// answers 502 for it.
type DeadError struct {
	Address string
	Reason  string
	// Unsent: the request was not sent (no session was up, or the session
	// died before the request went out), so the worker never saw it.
	Unsent bool
}

func (e *DeadError) Error() string {
	return fmt.Sprintf("engine worker %s is dead: %s", e.Address, e.Reason)
}

// Unwrap makes a request that was never sent read as a refused connection
// (syscall.ECONNREFUSED): the worker never saw it, so napd may hold it for
// the next worker instead of failing it.
func (e *DeadError) Unwrap() error {
	if e.Unsent {
		return syscall.ECONNREFUSED
	}
	return nil
}

// RejectedError is a worker that refused napd loudly (wire Error message),
// for example because it already serves another napd.
type RejectedError struct {
	Address string
	Message string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("engine worker %s rejected napd: %s", e.Address, e.Message)
}

// sendTimeout bounds one socket send.
const sendTimeout = 10 * time.Second

// Client is a connection to one worker that survives the worker's restarts.
// It is safe for concurrent use.
type Client struct {
	address string
	opts    Options
	log     *slog.Logger
	id      zmq4.SocketIdentity // kept across reconnects: the worker knows us
	nextID  atomic.Uint64

	mu     sync.Mutex
	cur    *conn         // nil while reconnecting
	up     chan struct{} // closed when cur becomes non-nil
	closed chan struct{}
}

// Dial connects to the worker at address and completes the handshake,
// retrying until ctx ends while nobody answers. It fails at once with a
// *wire.VersionError or *RejectedError when a worker answers but cannot
// serve this napd. After Dial the client reconnects by itself whenever the
// worker comes back.
func Dial(ctx context.Context, address string, opts Options) (*Client, error) {
	opts.setDefaults()
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	c := &Client{
		address: address,
		opts:    opts,
		log:     opts.Logger.With("address", address),
		id:      zmq4.SocketIdentity("napd-" + hex.EncodeToString(raw[:])),
		up:      make(chan struct{}),
		closed:  make(chan struct{}),
	}
	cn, err := c.connect(ctx, true)
	if err != nil {
		return nil, fmt.Errorf("dial engine %s: %w", address, err)
	}
	c.install(cn)
	return c, nil
}

// Close ends the session and stops reconnecting; requests in flight fail
// with a *DeadError.
func (c *Client) Close() error {
	c.mu.Lock()
	select {
	case <-c.closed:
		c.mu.Unlock()
		return nil
	default:
	}
	close(c.closed)
	cn := c.cur
	c.mu.Unlock()
	if cn != nil {
		cn.die("client closed")
	}
	return nil
}

// Dead returns a channel closed when the current session dies; while no
// session is up it is already closed.
func (c *Client) Dead() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return c.cur.dead
}

// Readiness asks the worker how it is and waits for its answer, waiting
// within ctx for a session if none is up (the worker may be restarting).
func (c *Client) Readiness(ctx context.Context) (engine.Readiness, error) {
	for {
		cn, up := c.current()
		if cn == nil {
			select {
			case <-up:
				continue
			case <-c.closed:
				return engine.Readiness{}, &DeadError{Address: c.address, Reason: "client closed"}
			case <-ctx.Done():
				return engine.Readiness{}, fmt.Errorf("readiness of %s: %w", c.address, ctx.Err())
			}
		}
		ch, err := cn.query()
		if err != nil {
			cn.die("send: " + err.Error())
		}
		select {
		case r := <-ch:
			return r, nil
		case <-cn.dead:
			// Wait for the next session.
		case <-ctx.Done():
			return engine.Readiness{}, fmt.Errorf("readiness of %s: %w", c.address, ctx.Err())
		}
	}
}

func (c *Client) current() (*conn, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.up
}

func (c *Client) install(cn *conn) {
	c.mu.Lock()
	select {
	case <-c.closed:
		c.mu.Unlock()
		cn.die("client closed")
		return
	default:
	}
	c.cur = cn
	close(c.up)
	c.mu.Unlock()
	c.log.Info("engine session up", "version", cn.version)
	if c.opts.OnState != nil {
		c.opts.OnState(Connected, nil)
	}
	cn.start()
}

// detach is called once when cn dies, before its death is visible: a
// request that sees the session dead then finds no session up, and is
// refused unsent rather than handed the dead one.
func (c *Client) detach(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == cn {
		c.cur = nil
		c.up = make(chan struct{})
	}
}

// lost is called once when a session has died: it reports and starts
// reconnecting.
func (c *Client) lost(err *DeadError) {
	c.log.Warn("engine session dead", "reason", err.Reason)
	if c.opts.OnState != nil {
		c.opts.OnState(Dead, err)
	}
	go c.reconnect()
}

func (c *Client) reconnect() {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-c.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer cancel()
	cn, err := c.connect(ctx, false)
	if err != nil {
		return // closed
	}
	c.install(cn)
}

// connect retries handshakes until one succeeds or ctx ends. With
// failFast, a worker that answers but refuses ends the attempts.
func (c *Client) connect(ctx context.Context, failFast bool) (*conn, error) {
	var lastErr error
	for {
		cn, err := c.handshake(ctx)
		if err == nil {
			return cn, nil
		}
		var ve *wire.VersionError
		var re *RejectedError
		refused := errors.As(err, &ve) || errors.As(err, &re)
		if refused && failFast {
			return nil, err
		}
		if lastErr == nil || err.Error() != lastErr.Error() { // log each new reason once
			c.log.Warn("engine handshake failed; retrying", "err", err)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last attempt: %v)", ctx.Err(), lastErr)
		case <-time.After(c.opts.HeartbeatInterval):
		}
	}
}

// handshake opens one socket and agrees on a version, within DeadAfter.
func (c *Client) handshake(ctx context.Context) (*conn, error) {
	sctx, stop := context.WithCancel(context.Background())
	sock := zmq4.NewDealer(sctx,
		zmq4.WithID(c.id),
		zmq4.WithDialerMaxRetries(0), // we retry ourselves, within ctx
		zmq4.WithTimeout(sendTimeout),
		zmq4.WithLogger(log.New(io.Discard, "", 0)))
	cn := &conn{
		client: c,
		sock:   sock,
		stop:   stop,
		in:     make(chan zmq4.Msg),
		rxDone: make(chan struct{}),
		dead:   make(chan struct{}),
		calls:  make(map[uint64]*call),
	}
	fail := func(err error) (*conn, error) {
		stop()
		sock.Close()
		return nil, err
	}
	if err := sock.Dial(c.address); err != nil {
		return fail(err)
	}
	go cn.receive(sctx)
	hello := &wire.Hello{
		MinVersion:      wire.MinVersion,
		MaxVersion:      wire.MaxVersion,
		Software:        Software,
		HeartbeatMillis: uint32(c.opts.HeartbeatInterval.Milliseconds()),
		DeadAfterMillis: uint32(c.opts.DeadAfter.Milliseconds()),
	}
	if err := cn.send(hello); err != nil {
		return fail(err)
	}
	timer := time.NewTimer(c.opts.DeadAfter)
	defer timer.Stop()
	var zm zmq4.Msg
	select {
	case zm = <-cn.in:
	case <-cn.rxDone:
		return fail(fmt.Errorf("handshake: %w", cn.rxErr))
	case <-timer.C:
		return fail(fmt.Errorf("handshake: no answer within %v", c.opts.DeadAfter))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	m, err := decodeOne(zm)
	if err != nil {
		return fail(fmt.Errorf("handshake: %w", err))
	}
	switch m := m.(type) {
	case *wire.Hello:
		v, err := wire.Negotiate(wire.Local, wire.Range{Min: m.MinVersion, Max: m.MaxVersion}, "napd", "worker")
		if err != nil {
			c.log.Error("engine worker speaks an incompatible protocol", "err", err, "software", m.Software)
			return fail(err)
		}
		cn.version = v
		cn.lastHeard.Store(time.Now().UnixNano())
		return cn, nil
	case *wire.Error:
		return fail(&RejectedError{Address: c.address, Message: m.Message})
	default:
		return fail(fmt.Errorf("handshake: worker sent message type 0x%02x before hello", byte(m.Type())))
	}
}

func decodeOne(zm zmq4.Msg) (wire.Message, error) {
	if len(zm.Frames) != 1 {
		return nil, fmt.Errorf("want one frame per message, got %d", len(zm.Frames))
	}
	return wire.Decode(zm.Frames[0])
}
