package agent

import (
	"fmt"
	"net/http"

	"github.com/napd/napd/gateway"
)

// The gateway's router API (llama.cpp's /models, load, unload, events) on
// napd's models: the gatewayModels adapter implements gateway.Router.
var _ gateway.Router = (*gatewayModels)(nil)

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
	if !m.Load(a.ctx, client, a.cfg.Load().Gateway.RequestTimeout) {
		return fmt.Errorf("model is already running: a load of %s is under way", name)
	}
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
func (g *gatewayModels) Changes() (<-chan struct{}, func()) { return g.agent().hub.Changes() }
