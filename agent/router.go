package agent

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// The gateway's router API (llama.cpp's /models, load, unload, events) on
// napd's models: the gatewayModels adapter implements gateway.Router.
var _ gateway.Router = (*gatewayModels)(nil)

// loadState maps a model's lifecycle onto the router API's vocabulary:
// serving (awake, draining, unsupported) is loaded; waking, also while it
// waits for GPU memory, is loading; asleep in a strategy that keeps the
// engine (vLLM's and SGLang's sleep modes, llama.cpp's own) is sleeping;
// stopped, failed or not yet verified is unloaded.
func loadState(s model.Snapshot) gateway.LoadState {
	switch st := s.Lifecycle.State; {
	case st.Serving() || st == lifecycle.Draining:
		return gateway.LoadLoaded
	case st == lifecycle.Waking:
		return gateway.LoadLoading
	case st == lifecycle.Sleeping && supervisor.KeepsEngine(s.Slept):
		return gateway.LoadSleeping
	}
	return gateway.LoadUnloaded
}

// routerInfo fills the router API's part of a model's listing, and the
// load's progress while it wakes: the fraction of its weights read (0 to
// 1) for /models and /models/sse when napd knows their size, the whole
// measure for /v1/models.
func routerInfo(info *gateway.ModelInfo, s model.Snapshot) {
	info.Load = loadState(s)
	info.Failed = s.Lifecycle.State == lifecycle.Failed
	info.Args = s.Spec.Command
	if l := s.Load; l != nil {
		info.Loading = l
		if l.HaveFraction {
			info.Progress = &l.Fraction
		}
	}
}

// loads are the router API's loads under way, one per model at a time.
type loads struct {
	mu sync.Mutex
	on map[string]bool
}

func (l *loads) start(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.on[name] {
		return false
	}
	if l.on == nil {
		l.on = make(map[string]bool)
	}
	l.on[name] = true
	return true
}

func (l *loads) done(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.on, name)
}

// Load implements gateway.Router: a wake as an arrival of client's with
// no request behind it (as napctl wake), off the caller, bounded like a
// request by request_timeout (and napd's lifetime). A failed model is
// reset first: a load is the operator's new try.
func (g *gatewayModels) Load(name, client string) error {
	a := g.agent()
	m, ok := a.reg.Load().byName[name]
	if !ok {
		return &gateway.Refusal{Status: http.StatusNotFound, Message: "model is not found"}
	}
	if !a.loads.start(name) {
		return fmt.Errorf("model is already running: a load of %s is under way", name)
	}
	if m.Snapshot().Lifecycle.State == lifecycle.Failed {
		m.Reset()
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if d := a.cfg.Load().Gateway.RequestTimeout; d > 0 {
		ctx, cancel = context.WithTimeout(a.ctx, d)
	} else {
		ctx, cancel = context.WithCancel(a.ctx)
	}
	go func() {
		defer a.loads.done(name)
		defer cancel()
		if err := admitOnce(ctx, m, client); err != nil {
			a.log.Info("load did not wake the model", "model", name, "client", client, "err", err)
		}
	}()
	return nil
}

// Unload implements gateway.Router: napctl sleep's operator sleep with
// the model's own strategy (its live requests drained first), answered
// once the model took it up.
func (g *gatewayModels) Unload(name string) error {
	m, ok := g.agent().reg.Load().byName[name]
	if !ok {
		return &gateway.Refusal{Status: http.StatusNotFound, Message: "model is not found"}
	}
	return m.StartSleep("")
}

// Changes implements gateway.Router: a signal after every event napd
// publishes (a state change, a wake, a sleep, a reload), coalesced.
func (g *gatewayModels) Changes() (<-chan struct{}, func()) {
	events, unsubscribe := g.agent().hub.Subscribe()
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-events:
				select {
				case out <- struct{}{}:
				default: // one signal waiting says it all
				}
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return out, func() { once.Do(func() { close(done); unsubscribe() }) }
}
