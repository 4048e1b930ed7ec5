package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/events"
	"github.com/napd/napd/engine"
	"github.com/napd/napd/engine/client"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/supervisor"
)

// Readiness polling of a loading worker: the pause doubles from the first
// to the last value. Each question is one message on a local socket.
const (
	readinessFirstPause = 20 * time.Millisecond
	readinessMaxPause   = 500 * time.Millisecond
)

// zmqEngine is the transport of a transport = "zmq" model: the
// engine/client connection to its worker. The worker does not run before
// the first wake, so the client is dialed then and kept for the model's
// life; it reconnects by itself whenever the worker is started again.
type zmqEngine struct {
	a       *Agent
	model   string
	address string
	log     *slog.Logger
	closed  atomic.Bool
	session atomic.Pointer[zmqSession] // the current (or last) session; nil before the first
	lost    atomic.Int64               // number of the last session whose death was applied
	mu      sync.Mutex                 // serialises the dial against Close
	c       atomic.Pointer[client.Client]
}

func (a *Agent) newZMQEngine(mc *config.Model) *zmqEngine {
	return &zmqEngine{a: a, model: mc.Name, address: mc.Address, log: a.log.With("model", mc.Name)}
}

// zmqSession is one connection to a worker instance.
type zmqSession struct {
	n    int64     // sessions of this engine so far, counting this one
	upAt time.Time // when it came up: it dates the worker instance
}

// RoundTrip implements http.RoundTripper through the worker's client.
// Before the first wake there is no session: *client.DeadError, a 502.
func (z *zmqEngine) RoundTrip(req *http.Request) (*http.Response, error) {
	c := z.c.Load()
	if c == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, &client.DeadError{Address: z.address, Reason: "not connected yet"}
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
func (z *zmqEngine) ready(ctx context.Context) error {
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

func (z *zmqEngine) dial(ctx context.Context) (*client.Client, error) {
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
	c, err := client.Dial(ctx, z.address, client.Options{Logger: z.log, OnState: z.onState})
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
func (z *zmqEngine) onState(st client.State, err error) {
	if st == client.Connected {
		var n int64
		if prev := z.session.Load(); prev != nil {
			n = prev.n
		}
		z.session.Store(&zmqSession{n: n + 1, upAt: z.a.clock()})
		return
	}
	z.sessionLost(z.session.Load(), err, false) // OnState must not block
}

// sessionLost has the model's loop apply the death of session s, and waits
// until it did when wait is set. OnState and each request that failed with
// the session report it; the loop applies it once.
func (z *zmqEngine) sessionLost(s *zmqSession, err error, wait bool) {
	if z.closed.Load() || s == nil {
		return
	}
	reason := "worker session lost"
	var dead *client.DeadError
	if errors.As(err, &dead) {
		reason = "worker dead: " + dead.Reason
	}
	m := z.a.reg.Load().byName[z.model]
	if m == nil {
		return
	}
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

// Close ends the connection for good (model removed, napd stopping).
func (z *zmqEngine) Close() {
	z.closed.Store(true)
	z.mu.Lock()
	c := z.c.Load()
	z.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// verifyOf is how a wake verifies the engine behind tr: nil (the HTTP
// health poll) unless tr is a ZMQ worker's connection.
func verifyOf(tr http.RoundTripper) supervisor.Verify {
	if z, ok := tr.(*zmqEngine); ok {
		return z.ready
	}
	return nil
}

// closeTransport ends a model's worker connection, if it has one.
func closeTransport(tr http.RoundTripper) {
	if z, ok := tr.(*zmqEngine); ok {
		z.Close()
	}
}

// zmqEvidence is the engine evidence of a serving ZMQ worker. A worker
// serves one napd session at a time, so every request it runs came through
// the gateway and holds a lease: the leases are the whole truth, and the
// engine adds nothing to them.
var zmqEvidence = enginemetrics.Evidence{Engine: config.TransportZMQ, Counts: true}

// startEventPublisher binds the PUB socket of agent.events_address and
// forwards the lifecycle events (state, wake, sleep) the agent emits until
// ctx ends, then closes it. The hub drops events the publisher does not
// take at once, so publishing never slows a model's loop.
func (a *Agent) startEventPublisher(ctx context.Context, address string) error {
	pub, err := events.NewPublisher(address)
	if err != nil {
		return err
	}
	ch, unsubscribe := a.hub.subscribe()
	a.helpers.Add(1)
	go func() {
		defer a.helpers.Done()
		defer pub.Close()
		defer unsubscribe()
		for {
			select {
			case <-ctx.Done():
				return
			case e := <-ch:
				ev, ok := lifecycleEvent(e)
				if !ok {
					continue
				}
				if err := pub.Publish(ev); err != nil {
					a.log.Warn("publishing a lifecycle event", "err", err)
				}
			}
		}
	}()
	a.log.Info("publishing lifecycle events", "address", address)
	return nil
}

// lifecycleEvent maps an agent event onto the published schema; planner
// decisions and reloads are not model lifecycle events.
func lifecycleEvent(e control.Event) (events.Event, bool) {
	kind := events.Kind(e.Kind)
	if e.Model == "" || (kind != events.KindState && kind != events.KindWake && kind != events.KindSleep) {
		return events.Event{}, false
	}
	return events.Event{
		Time: e.Time, Model: e.Model, Kind: kind, From: e.From, To: e.To, Reason: e.Reason,
		WakeDuration: time.Duration(e.WakeMs) * time.Millisecond,
	}, true
}
