package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"
)

// HeaderServedBy names the remote model that served a request napd sent
// away from the model it was asked for (overflow, docs/remote.md).
const HeaderServedBy = "X-Napd-Served-By"

// Remote is a model served elsewhere, as a Ticket reaches it: the request
// goes through the same forwarding path as an engine's, with three
// differences. No X-Forwarded-* headers (the addresses of napd's clients
// are no business of a hosted API); napd's credential, when it holds one,
// replaces whatever the client sent (Authorization, X-Api-Key and the
// credential's own header: with API keys on they are napd's and removed
// anyway, with keys off the client's own must not reach a remote napd
// holds a credential for); and errors name the remote. One Remote is
// shared by every ticket of a remote model: treat it as read-only.
type Remote struct {
	// Name is the remote model's name in napd's config; Where is its
	// host, for messages ("api.example.com").
	Name, Where string
	// Credential is set on the remote's requests, nil when napd holds
	// none (the client's headers then pass as they would to an engine).
	Credential http.Header
}

// upstreamName names where a request goes, for messages: a model's engine,
// or a remote model.
func (c *call) upstreamName() string {
	if t := c.ticket; t != nil && t.Remote != nil {
		return "remote model " + t.Remote.Name + " (" + t.Remote.Where + ")"
	}
	return "the engine of model " + c.model
}

// setCredential gives a remote's request napd's credential in place of
// the client's.
func (r *Remote) setCredential(h http.Header) {
	if r.Credential == nil {
		return
	}
	h.Del("Authorization")
	h.Del("X-Api-Key")
	for k, v := range r.Credential {
		h[k] = v
	}
}

// Bounds of a connection to a remote model: it is across a network, not
// on loopback, so a dial and a TLS handshake get longer than an engine's
// dial, but no longer than a client should wait to learn the remote is
// unreachable (a 502 naming it).
const (
	RemoteDialTimeout  = 10 * time.Second
	RemoteTLSHandshake = 10 * time.Second
	RemoteIdleTimeout  = EngineIdleTimeout
)

// RemoteTransportOptions shape the transport of one remote model.
type RemoteTransportOptions struct {
	// MaxIdle is the most idle connections kept (its max_concurrency).
	MaxIdle int
	// RootCAs, when not nil, is the only pool the remote's certificate is
	// checked against (tls_ca_file); nil is the system's.
	RootCAs *x509.CertPool
	// ServerName, when not "", is the name checked in the certificate
	// instead of the URL's host.
	ServerName string
}

// NewRemoteTransport is the http.Transport of one remote model, built
// with NewTransport's care for a remote across a network: TLS verified
// (against RootCAs when set, TLS 1.2 at least), dials bounded by
// RemoteDialTimeout and handshakes by RemoteTLSHandshake, HTTP/1.1 (what
// the forwarding path speaks, upgrades included), no compression (bodies
// pass as they are; a renamed model's answer must be read), up to MaxIdle
// idle connections closed after RemoteIdleTimeout (an OpenAI-compatible
// server behind uvicorn closes its own after 5 s: a request is never sent
// on a connection it is closing), and the proxy of the environment
// (HTTPS_PROXY, NO_PROXY; napd.service sets none). No bound on the
// answer's head, as for an engine: the request's deadline covers it.
func NewRemoteTransport(o RemoteTransportOptions) *http.Transport {
	dialer := &net.Dialer{Timeout: RemoteDialTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: o.RootCAs, ServerName: o.ServerName, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: RemoteTLSHandshake,
		MaxIdleConnsPerHost: max(o.MaxIdle, 1),
		IdleConnTimeout:     RemoteIdleTimeout,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

// remoteFailure says, for a 502 naming a remote, why it could not be
// reached, when the cause is one an operator acts on (a certificate);
// "" otherwise. The error itself is logged, never sent.
func remoteFailure(err error) string {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &unknown):
		return "its TLS certificate is not signed by a trusted authority (tls_ca_file)"
	case errors.As(err, &host):
		return "its TLS certificate is not for its host"
	case errors.As(err, &invalid), errors.As(err, &verify):
		return "its TLS certificate could not be verified"
	case strings.Contains(err.Error(), "tls: "):
		return "the TLS handshake failed"
	}
	return ""
}
