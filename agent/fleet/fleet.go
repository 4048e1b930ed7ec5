// Package fleet is what napd tells the load balancers in front of several
// napd hosts (docs/fleet.md): each model's health as HAProxy's agent check
// asks for it, from the model's published snapshot, never its loop, so a
// check cannot wait on a busy model; and, before napd stops, drain for
// every model until each balancer has heard it.
//
// It decides what a balancer is told; agentcheck speaks the protocol.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agentcheck"
)

// Serve serves HAProxy's agent check on addr (agent.haproxy_agent_listen):
// lookup finds a model's snapshot by name or alias; stopping says napd
// stops (every model drains then).
func Serve(addr string, lookup func(name string) (model.Snapshot, bool), stopping func() bool, log *slog.Logger) (*agentcheck.Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("haproxy_agent_listen %s: %w", addr, err)
	}
	log = log.With("listener", "haproxy agent")
	srv := agentcheck.New(func(name string) (agentcheck.Status, bool) {
		s, ok := lookup(name)
		if !ok {
			return agentcheck.Status{}, false
		}
		return Status(s, stopping()), true
	}, agentcheck.Options{Logger: log})
	go func() {
		if err := srv.Serve(l); !errors.Is(err, net.ErrClosed) {
			log.Error("server stopped", "err", err)
		}
	}()
	return srv, nil
}

// Status is what a balancer is told of a model in snapshot s; a stopping
// napd drains every model.
func Status(s model.Snapshot, stopping bool) agentcheck.Status {
	health := Health(s.Lifecycle)
	state := s.Lifecycle.State.String()
	if s.Lifecycle.RoomWait {
		state = "waiting for room"
	}
	if stopping {
		health, state = agentcheck.Draining, "napd stopping"
	}
	return agentcheck.Status{Health: health, State: state, QueueDepth: s.QueueDepth}
}

// Bounds of tellBalancers: HAProxy asks every agent-inter (2 s by
// default, 1 s in docs/examples/haproxy.cfg).
const (
	askedLately      = 5 * time.Second // a balancer that asked within it is waited for
	tellBalancersFor = 5 * time.Second // at most, and within the shutdown grace
)

// Drain waits, once every answer is drain (napd stopping: Status), until
// each balancer that asked lately has asked again, before the gateway
// stops listening: HAProxy then sends this host no new request. A
// connection refused by a stopped host is retried at once, on the same
// host as long as HAProxy still counts it up (its health check takes a
// second or two to see it down), so without this the requests of that
// moment failed.
func Drain(srv *agentcheck.Server, grace time.Duration, log *slog.Logger) {
	since := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), min(grace, tellBalancersFor))
	defer cancel()
	if err := srv.AskedAgain(ctx, since, askedLately); err != nil {
		log.Warn("stopping before every balancer asked again and was told to drain", "waited", time.Since(since).Round(time.Millisecond))
		return
	}
	log.Info("balancers told to drain", "waited", time.Since(since).Round(time.Millisecond))
}

// Health is the one place that decides what a balancer is told about a
// model. A wake under way counts as serving: the requests that
// follow the one that woke it queue for it, instead of waking the model on
// another host too. A wake that waits for GPU memory other models hold
// drains, as a drain does: the next requests go to another host.
func Health(lc lifecycle.Snapshot) agentcheck.Health {
	switch lc.State {
	case lifecycle.Waking:
		if lc.RoomWait {
			return agentcheck.Draining
		}
		return agentcheck.Serving
	case lifecycle.Awake, lifecycle.Unsupported:
		return agentcheck.Serving
	case lifecycle.Sleeping, lifecycle.Unverified:
		return agentcheck.Wakeable
	case lifecycle.Draining:
		return agentcheck.Draining
	}
	return agentcheck.Failed
}
