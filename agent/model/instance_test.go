package model

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

// engineOn serves 200 on a loopback port and counts the requests it saw.
func engineOn(t *testing.T) (port int, seen *atomic.Int32) {
	t.Helper()
	seen = new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen.Add(1) }))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port, seen
}

// deadPort is a loopback port nothing listens on.
func deadPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

func send(tk *gateway.Ticket) error {
	req, _ := http.NewRequest(http.MethodPost, tk.Target.String()+"/v1/chat/completions", nil)
	resp, err := tk.Transport.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// reroute runs the ticket's Reroute on its own goroutine.
func reroute(tk *gateway.Ticket) *admission {
	a := &admission{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.ticket, a.err = tk.Reroute(context.Background())
	}()
	return a
}

// A request granted to an engine instance that exits before it connects
// never reaches what listens on that port next (the new instance, not yet
// verified): its connection is refused, and rerouted it is served by the
// next instance once that one's wake verified it.
func TestGrantedRequestNeverReachesTheNextUnverifiedInstance(t *testing.T) {
	port, seen := engineOn(t) // stands for the next instance on the remembered port
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Port = port })
	tk := r.granted(r.admit(context.Background()))
	r.clock.Advance(1)
	r.m.EngineExited("signal: killed", r.clock.Now())
	wake := r.next("wake") // the lease is live: the next instance starts

	err := send(tk)
	if !errors.Is(err, syscall.ECONNREFUSED) || seen.Load() != 0 {
		t.Fatalf("the exited instance's request: %v, %d requests reached the port", err, seen.Load())
	}
	again := reroute(tk)
	r.until("queued for the wake", func(s Snapshot) bool { return s.QueueDepth == 1 })
	if !again.pending() {
		t.Fatal("rerouted before the next instance was verified")
	}
	wake.reply <- nil
	next := r.granted(again)
	if err := send(next); err != nil || seen.Load() != 1 {
		t.Fatalf("the next instance: %v, %d requests", err, seen.Load())
	}
	tk.Done(gateway.Outcome{})
	r.until("idle", func(s Snapshot) bool { return s.Active == 0 && s.QueueDepth == 0 })
	if ev, _ := r.m.d.Tracker.Evidence("m"); ev.Active != 0 {
		t.Errorf("%d leases live", ev.Active)
	}
}

// An engine napd counts as serving that refuses a connection has lost its
// listener: it is handled as an exit at once (stopped, then woken again),
// and the refused request waits for that wake instead of failing.
func TestRefusedConnectionWaitsForTheNextWake(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.Port = deadPort(t) })
	tk := r.granted(r.admit(context.Background()))
	if err := send(tk); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("send: %v", err)
	}
	again := reroute(tk)
	stop := r.next("sleep") // what is left of the engine is stopped first
	if stop.strategy != sleepmode.Stop {
		t.Errorf("stopped with %q", stop.strategy)
	}
	stop.reply <- nil
	r.next("wake").reply <- nil
	r.granted(again)
	tk.Done(gateway.Outcome{}) // the first ticket's Done ends the lease
	r.expect(lifecycle.Awake)
}

// A request the model cannot take back (it failed meanwhile) gets the
// model's refusal from Reroute.
func TestRerouteRefusedWhenTheModelFails(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.WakeAttempts = 1 })
	tk := r.granted(r.admit(context.Background()))
	r.clock.Advance(1)
	r.m.EngineExited("signal: killed", r.clock.Now())
	r.next("wake").reply <- &supervisor.ExitError{Model: "m", State: supervisor.ProcFailed, Reason: "exit status 1"}
	r.until("failed", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Failed })
	_, err := reroute(tk).result(t)
	var ref *gateway.Refusal
	if !errors.As(err, &ref) || ref.Status != http.StatusServiceUnavailable {
		t.Fatalf("reroute of a failed model: %v", err)
	}
	tk.Done(gateway.Outcome{Outcome: lease.Outcome{Cancelled: true}})
	r.until("idle", func(s Snapshot) bool { return s.Active == 0 && s.QueueDepth == 0 })
}

// A connect timeout is a reason to check the engine's health: it is probed
// at once, not at the next health_interval, and the watch's rules decide.
func TestConnectTimeoutProbesAtOnce(t *testing.T) {
	r := newRig(t, supervisor.Awake, func(c *config.Model) { c.HealthInterval, c.HealthFailures = time.Minute, 1 })
	r.granted(r.admit(context.Background())).Done(gateway.Outcome{})
	r.sync()
	select {
	case <-r.probes:
		t.Fatal("probed without a reason before health_interval passed")
	default:
	}
	r.granted(r.admit(context.Background())).Done(gateway.Outcome{Fault: gateway.FaultConnectTimeout})
	r.sync()
	select {
	case reply := <-r.probes:
		reply <- ProbeResult{Err: errors.New("GET /health: context deadline exceeded")}
	case <-time.After(within):
		t.Fatal("no health probe after a connect timeout")
	}
	r.until("unverified", func(s Snapshot) bool { return s.Lifecycle.State == lifecycle.Unverified })
}
