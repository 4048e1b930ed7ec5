package model

import (
	"net"
	"net/http"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/supervisor"
)

// Link is how napd reaches one model's engine: the round tripper granted
// requests use, and how a wake verifies the engine is ready. Two
// implementations: HTTP (an engine on loopback) and ZMQ (a worker behind
// engine/client).
type Link interface {
	// Transport carries requests to the engine.
	Transport() http.RoundTripper
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
	return newHTTPLink()
}

// httpLink is one tuned transport per engine on loopback.
type httpLink struct{ tr *http.Transport }

func newHTTPLink() *httpLink {
	return &httpLink{tr: &http.Transport{
		Proxy:                 nil, // loopback: never through a proxy
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // the request's deadline governs
		ForceAttemptHTTP2:     false,
	}}
}

func (l *httpLink) Transport() http.RoundTripper { return l.tr }
func (l *httpLink) Verify() supervisor.Verify    { return nil }

// Close drops idle connections; requests in flight finish on theirs.
func (l *httpLink) Close() { l.tr.CloseIdleConnections() }
