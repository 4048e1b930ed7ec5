package model

import (
	"net/http"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/gateway"
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

// httpLink gives each engine instance its own pool of connections on
// loopback (gateway.NewTransport), so no connection outlives the instance
// it was made to. Each pool keeps as many idle connections as the model
// forwards requests at once (max_concurrency).
type httpLink struct{ maxIdle int }

func newHTTPLink(maxConcurrency int) httpLink { return httpLink{maxIdle: max(maxConcurrency, 1)} }

func (l httpLink) Transport(gone func() bool) http.RoundTripper {
	return gateway.NewTransport(l.maxIdle, gone)
}

func (httpLink) Verify() supervisor.Verify { return nil }

// Close has nothing to do: each instance's transport is closed with it.
func (httpLink) Close() {}
