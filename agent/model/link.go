package model

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/internal/h1"
	"github.com/napd/napd/supervisor"
)

// Link is how napd reaches one model's engine: the round tripper granted
// requests use, and how a wake verifies the engine is ready. Two
// implementations: HTTP (an engine on loopback) and ZMQ (a worker behind
// engine/client).
type Link interface {
	// Transport carries requests to one engine instance. Once gone reports
	// true the instance has exited or been replaced: a request granted to
	// it that has not connected yet must not reach whatever listens on
	// its port now.
	Transport(gone func() bool) http.RoundTripper
	// Verify is how a wake proves the engine ready; nil means the
	// supervisor's HTTP health poll.
	Verify() supervisor.Verify
	// Close ends the link for good (model removed, napd stopping, or the
	// link replaced by a reload).
	Close()
}

// newLink is the link of cfg's transport.
func (m *Model) newLink(cfg *config.Model) Link {
	if cfg.Transport == config.TransportZMQ {
		return newZMQLink(m, cfg.Address)
	}
	return newHTTPLink(cfg.MaxConcurrency)
}

// connectTimeout bounds a connection to an engine on loopback: one that
// does not accept in this time is frozen or swamped (502, and a health
// check), whatever the request's own deadline.
const connectTimeout = 5 * time.Second

// httpLink gives each engine instance its own pool of connections on
// loopback, so no connection outlives the instance it was made to. The
// requests are written and answered on the caller's goroutine (package
// h1): net/http's Transport would hand each to a connection's read and
// write loops and back.
//
// Each pool keeps as many idle connections as the model forwards requests
// at once (max_concurrency): never more than can be in use, and under
// steady load no connection is closed only to be opened again.
type httpLink struct{ maxIdle int }

func newHTTPLink(maxConcurrency int) httpLink { return httpLink{maxIdle: max(maxConcurrency, 1)} }

func (l httpLink) Transport(gone func() bool) http.RoundTripper {
	dialer := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	return &h1.Transport{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if gone() {
				return nil, instanceGone(network, addr)
			}
			conn, err := dialer.DialContext(ctx, network, addr)
			if err == nil && gone() { // it went while this dial ran
				conn.Close()
				return nil, instanceGone(network, addr)
			}
			return conn, err
		},
		MaxIdle:     l.maxIdle,
		IdleTimeout: 90 * time.Second,
		Retired:     gone,
	}
}

func (httpLink) Verify() supervisor.Verify { return nil }

// Close has nothing to do: each instance's transport is closed with it.
func (httpLink) Close() {}

// instanceGone is the dial error of a request granted to an engine
// instance that has gone: a refused connection (the engine never saw the
// request), so the gateway hands it back to wait for the next instance.
func instanceGone(network, addr string) error {
	return &net.OpError{Op: "dial", Net: network, Addr: staticAddr(addr),
		Err: fmt.Errorf("the engine instance this request was granted to has exited: %w", syscall.ECONNREFUSED)}
}

type staticAddr string

func (a staticAddr) Network() string { return "tcp" }
func (a staticAddr) String() string  { return string(a) }
