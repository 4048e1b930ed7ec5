package model

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/engine"
	"github.com/napd/napd/engine/client"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// Readiness polling of a loading worker: the pause doubles from the first
// to the last value. Each question is one message on a local socket.
const (
	readinessFirstPause = 20 * time.Millisecond
	readinessMaxPause   = 500 * time.Millisecond
)

// zmqLink is the link of a transport = "zmq" model: the engine/client
// connection to its worker. The worker does not run before the first wake,
// so the client is dialed then and kept for the link's life; it reconnects
// by itself whenever the worker is started again.
type zmqLink struct {
	m       *Model
	address string
	closed  atomic.Bool
	session atomic.Pointer[zmqSession] // the current (or last) session; nil before the first
	lost    atomic.Int64               // number of the last session whose death was applied (loop only)
	mu      sync.Mutex                 // serialises the dial against Close
	c       atomic.Pointer[client.Client]
}

func newZMQLink(m *Model, address string) *zmqLink {
	return &zmqLink{m: m, address: address}
}

// zmqSession is one connection to a worker instance.
type zmqSession struct {
	n    int64     // sessions of this link so far, counting this one
	upAt time.Time // when it came up: it dates the worker instance
}

// Transport is the one session to the worker: a worker instance's death
// ends it (DeadError), so gone adds nothing.
func (z *zmqLink) Transport(func() bool) http.RoundTripper { return z }
func (z *zmqLink) Verify() supervisor.Verify               { return z.ready }

// RefusesBeforeWork marks a ZMQ worker's transport as a
// gateway.RefusingTransport: by the engine contract, its "no room" 503 is
// sent before the worker starts on the request, so the gateway passes it on
// as 503 (which a balancer may retry on another host).
func (*zmqLink) RefusesBeforeWork() {}

var _ gateway.RefusingTransport = (*zmqLink)(nil)

// RoundTrip implements http.RoundTripper through the worker's client.
// Before the first wake there is no session: *client.DeadError, a 502.
func (z *zmqLink) RoundTrip(req *http.Request) (*http.Response, error) {
	c := z.c.Load()
	if c == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &client.DeadError{Address: z.address, Reason: "not connected yet", Unsent: true}
	}
	s := z.session.Load()
	resp, err := c.RoundTrip(req)
	if errors.As(err, new(*client.DeadError)) {
		// The lifecycle learns of the death before this 502 goes out
		// (OnState reports it concurrently), so a client that retries at
		// once finds the model waking, not still awake on a dead session.
		z.sessionLost(s, err, true)
	}
	return resp, err
}

// ready is the wake verification of a worker, in place of an HTTP health
// poll: it connects if needed, then asks the worker's readiness until it is
// Ready, fails with the worker's reason when it reports Failed, and gives
// up when ctx (the wake's deadline) ends.
func (z *zmqLink) ready(ctx context.Context) error {
	c, err := z.dial(ctx)
	if err != nil {
		return err
	}
	pause := readinessFirstPause
	for {
		r, err := c.Readiness(ctx)
		if err != nil {
			return err
		}
		switch r.State {
		case engine.Ready:
			return nil
		case engine.Failed:
			return fmt.Errorf("worker %s reports failed: %s", z.address, r.Reason)
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("worker %s not ready (%s): %w", z.address, r.Reason, ctx.Err())
		case <-timer.C:
		}
		pause = min(2*pause, readinessMaxPause)
	}
}

func (z *zmqLink) dial(ctx context.Context) (*client.Client, error) {
	if c := z.c.Load(); c != nil {
		return c, nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if c := z.c.Load(); c != nil {
		return c, nil
	}
	if z.closed.Load() {
		return nil, fmt.Errorf("worker %s: connection closed", z.address)
	}
	if err := waitForSocket(ctx, z.address); err != nil {
		return nil, err
	}
	c, err := client.Dial(ctx, z.address, client.Options{Logger: z.m.log, OnState: z.onState})
	if err != nil {
		return nil, err
	}
	z.c.Store(c)
	return c, nil
}

// waitForSocket waits within ctx until a just started worker has bound its
// ipc:// socket file, so the first dial finds it instead of waiting out the
// client's retry pause (a heartbeat interval) on every cold start.
func waitForSocket(ctx context.Context, address string) error {
	path, ok := strings.CutPrefix(address, "ipc://")
	if !ok {
		return nil
	}
	pause := readinessFirstPause
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("worker did not bind %s: %w", address, ctx.Err())
		case <-timer.C:
		}
		pause = min(2*pause, readinessMaxPause)
	}
}

// onState turns a dead session (the worker exited, closed its socket, or
// went silent past the heartbeat bound) into an engine exit of the model:
// the lifecycle makes it sleeping, or waking if requests wait. Requests in
// flight have already failed with *client.DeadError (502).
func (z *zmqLink) onState(st client.State, err error) {
	if st == client.Connected {
		var n int64
		if prev := z.session.Load(); prev != nil {
			n = prev.n
		}
		z.session.Store(&zmqSession{n: n + 1, upAt: z.m.now()})
		return
	}
	z.sessionLost(z.session.Load(), err, false) // OnState must not block
}

// sessionLost has the model's loop apply the death of session s, and waits
// until it did when wait is set. OnState and each request that failed with
// the session report it; the loop applies it once.
func (z *zmqLink) sessionLost(s *zmqSession, err error, wait bool) {
	if z.closed.Load() || s == nil {
		return
	}
	reason := "worker session lost"
	var dead *client.DeadError
	if errors.As(err, &dead) {
		reason = "worker dead: " + dead.Reason
	}
	m := z.m
	apply := func() {
		if z.lost.Load() >= s.n {
			return
		}
		z.lost.Store(s.n)
		// The session's start dates the worker instance that died: a wake
		// that began after it (started by the process's own exit event,
		// which may come first) is not failed by this late notice.
		at := s.upAt
		// A worker that went silent may still run: stop it before the
		// next wake rather than wait on it for a whole wake_timeout.
		if !m.exitIsStale(at) {
			m.stale = true
		}
		m.engineExited(reason, at)
	}
	if wait {
		m.call(apply)
	} else {
		go m.do(apply)
	}
}

// Close ends the connection for good.
func (z *zmqLink) Close() {
	z.closed.Store(true)
	z.mu.Lock()
	c := z.c.Load()
	z.mu.Unlock()
	if c != nil {
		c.Close()
	}
}
