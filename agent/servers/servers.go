// Package servers opens napd's listeners and runs its HTTP servers: the
// gateway's (socket-activated or bound), each model's own socket, the
// control socket, the metrics listener and HAProxy's agent check; and
// stops them all within a grace period.
package servers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agentcheck"
	"github.com/napd/napd/gateway"
)

// The metrics listener's bounds: open connections, and how long an idle
// keep-alive one stays.
const (
	metricsConnections = 64
	MetricsIdle        = 75 * time.Second
)

// Handlers are what the servers serve.
type Handlers struct {
	Gateway http.Handler                   // every gateway listener's
	Model   func(name string) http.Handler // a model's own socket's (listen)
	Control http.Handler                   // the control socket's
	Metrics http.Handler                   // the metrics listener's, when metrics_listen is set
	// AgentCheck starts HAProxy's agent check on an address, when
	// haproxy_agent_listen is set.
	AgentCheck func(addr string) (*agentcheck.Server, error)
}

// Contexts are the requests' contexts: Requests is every gateway and
// metrics request's, so a shutdown reaches them all; Control is the
// control requests', which End cancels first: event followers (napctl
// events -f) never end on their own, and Shutdown would wait the whole
// grace period for them.
type Contexts struct {
	Requests, Control context.Context
	End               context.CancelFunc
}

// Servers is what Start started.
type Servers struct {
	gateway    []*http.Server
	control    *http.Server
	endControl context.CancelFunc
	metrics    *http.Server
	AgentCheck *agentcheck.Server // nil when haproxy_agent_listen is off
	log        *slog.Logger
}

// Start opens cfg's listeners and starts their servers.
func Start(cfg *config.Config, h Handlers, ctxs Contexts, log *slog.Logger) (*Servers, error) {
	modelListen := make(map[string]string)
	for _, m := range cfg.Models {
		if m.Listen != "" {
			modelListen[m.Name] = m.Listen
		}
	}
	gls, mls, activated, err := gateway.Listeners(cfg.Gateway.Listen, modelListen)
	if err != nil {
		return nil, err
	}
	s := &Servers{endControl: ctxs.End, log: log}
	newServer := func(h http.Handler, ctx context.Context) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 30 * time.Second,
			BaseContext:       func(net.Listener) context.Context { return ctx },
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		}
	}
	// Client-facing servers: idle keep-alive connections are closed after
	// keepalive_timeout, and all of them together hold at most
	// max_connections descriptors.
	conns := gateway.NewConnLimit(cfg.Gateway.MaxConnections, log.With("listener", "gateway", "key", "gateway.max_connections"))
	serveGateway := func(h http.Handler, l net.Listener, what string) {
		srv := gateway.NewServer(h, gateway.ServerOptions{
			KeepaliveTimeout: cfg.Gateway.KeepaliveTimeout,
			BaseContext:      ctxs.Requests,
			Logger:           log.With("listener", what),
		})
		s.gateway = append(s.gateway, srv)
		go s.serveOn(srv, conns.Listener(l), what)
	}
	for _, l := range gls {
		serveGateway(h.Gateway, l, "gateway")
	}
	for name, l := range mls {
		serveGateway(h.Model(name), l, "model "+name)
	}
	cl, err := control.Listen(cfg.Agent.ControlSocket)
	if err != nil {
		return nil, err
	}
	s.control = newServer(h.Control, ctxs.Control)
	go s.serveOn(s.control, cl, "control")
	if cfg.Agent.MetricsListen != "" {
		ml, err := net.Listen("tcp", cfg.Agent.MetricsListen)
		if err != nil {
			return nil, fmt.Errorf("metrics_listen %s: %w", cfg.Agent.MetricsListen, err)
		}
		s.metrics = newServer(h.Metrics, ctxs.Requests)
		// A scraper needs few connections; a local user gets no more.
		s.metrics.IdleTimeout = MetricsIdle
		limit := gateway.NewConnLimit(metricsConnections, log.With("listener", "metrics"))
		go s.serveOn(s.metrics, limit.Listener(ml), "metrics")
	}
	if cfg.Agent.HAProxyAgentListen != "" {
		if s.AgentCheck, err = h.AgentCheck(cfg.Agent.HAProxyAgentListen); err != nil {
			return nil, err
		}
	}
	log.Info("listening", "gateway", addrs(gls), "socket_activated", activated,
		"control", cfg.Agent.ControlSocket, "metrics", cfg.Agent.MetricsListen,
		"haproxy_agent", cfg.Agent.HAProxyAgentListen)
	return s, nil
}

func addrs(ls []net.Listener) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Addr().String()
	}
	return out
}

func (s *Servers) serveOn(srv interface{ Serve(net.Listener) error }, l net.Listener, what string) {
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error("server stopped", "listener", what, "err", err)
	}
}

// Shutdown stops accepting and lets in-flight requests finish within
// grace; what is still open then (long streams) is closed. Inherited
// sockets stay with systemd, which queues new connections for the next
// napd.
func (s *Servers) Shutdown(grace time.Duration) {
	s.endControl()
	if s.AgentCheck != nil {
		s.AgentCheck.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var wg sync.WaitGroup
	all := []interface {
		Shutdown(context.Context) error
		Close() error
	}{s.control}
	for _, g := range s.gateway {
		all = append(all, g)
	}
	if s.metrics != nil {
		all = append(all, s.metrics)
	}
	for _, srv := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Shutdown(ctx); err != nil {
				srv.Close()
			}
		}()
	}
	wg.Wait()
}
