package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"
)

// The HTTP stack napd runs is net/http's, on both sides of the gateway:
// clients are served by the http.Server NewServer makes and engines are
// reached through the http.Transport NewTransport makes (docs/gateway.md,
// "The HTTP server"). The agent and the gateway's tests build both here,
// so the tests go through what napd ships.

// ServerOptions configure the http.Server of a gateway socket.
type ServerOptions struct {
	// KeepaliveTimeout closes a keep-alive connection idle this long;
	// 0 turns keep-alive off (a connection serves one request).
	KeepaliveTimeout time.Duration
	// BaseContext is every request's parent: napd's lifetime.
	BaseContext context.Context
	// Logger gets net/http's own complaints (bad requests, TLS noise) at
	// debug level: a client's mistake is not napd's error.
	Logger *slog.Logger
}

// ReadHeaderTimeout bounds the arrival of a request's head, as nginx's
// client_header_timeout (60 s there).
const ReadHeaderTimeout = 30 * time.Second

// NewServer is the http.Server of a gateway socket, serving h. The body's
// bounds (max_body, body_timeout), the write bound (write_timeout) and the
// request's deadline are the gateway's, per request; what the server
// bounds itself is the head (ReadHeaderTimeout, MaxHeaderBytes) and the
// idle connection (KeepaliveTimeout). max_connections is a listener of
// ConnLimit's around the socket.
func NewServer(h http.Handler, opts ServerOptions) *http.Server {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	base := opts.BaseContext
	if base == nil {
		base = context.Background()
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       opts.KeepaliveTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	srv.SetKeepAlivesEnabled(opts.KeepaliveTimeout > 0)
	return srv
}

// DialTimeout bounds a connection to an engine on loopback: one that does
// not accept in this time is frozen or swamped (502, and a health check),
// whatever the request's own deadline.
const DialTimeout = 5 * time.Second

// EngineIdleTimeout closes a connection to an engine idle this long. The
// engines' own HTTP servers close idle connections after 5 s (uvicorn's
// timeout_keep_alive in vLLM and SGLang, llama.cpp's Keep-Alive timeout):
// a request sent on a connection at the moment the engine closes it would
// fail, and a POST is not retried. Closing first, on loopback where a new
// connection costs some tens of microseconds, leaves no such moment.
const EngineIdleTimeout = 4 * time.Second

// NewTransport is the http.Transport of one engine instance on loopback:
// no proxy, no compression (bodies pass as they are; a renamed model's
// answer must be read), HTTP/1.1 only, up to maxIdle idle connections
// (the model's max_concurrency: never more than can be in use, and under
// steady load no connection is closed only to be opened again), dials
// bounded by DialTimeout. No bound on the answer's head: a completion
// that is not streamed sends its head when it is done, minutes later; the
// request's own deadline covers it.
//
// Once gone (not nil) reports true the instance has exited or been
// replaced: a request granted to it that has not connected yet must not
// reach whatever listens on its port now. Its dial fails as a refused
// connection would (the engine never saw the request), so the gateway
// hands the request back to wait for the next instance (Ticket.Reroute).
func NewTransport(maxIdle int, gone func() bool) *http.Transport {
	dialer := &net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second}
	dial := dialer.DialContext
	if gone != nil {
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if gone() {
				return nil, instanceGone(network, addr)
			}
			conn, err := dialer.DialContext(ctx, network, addr)
			if err == nil && gone() { // it went while this dial ran
				_ = conn.Close()
				return nil, instanceGone(network, addr)
			}
			return conn, err
		}
	}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         dial,
		MaxIdleConnsPerHost: max(maxIdle, 1),
		IdleConnTimeout:     EngineIdleTimeout,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

// instanceGone is the dial error of a request granted to an engine
// instance that has gone.
func instanceGone(network, addr string) error {
	return &net.OpError{Op: "dial", Net: network, Addr: staticAddr(addr),
		Err: fmt.Errorf("the engine instance this request was granted to has exited: %w", syscall.ECONNREFUSED)}
}

type staticAddr string

func (a staticAddr) Network() string { return "tcp" }
func (a staticAddr) String() string  { return string(a) }
