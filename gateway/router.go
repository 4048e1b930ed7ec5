package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// llama.cpp's router API (llama-server --models-dir), which UIs such as
// Open WebUI use to show a model's load state and to load or eject it,
// served on napd's gateway for napd's models: GET /models, POST
// /models/load, POST /models/unload and GET /models/sse. These paths are
// napd's own on the shared socket; toward an engine (/upstream/…, a
// model's own socket) they stay engine controls, refused (pathrule).

// LoadState is a model's state in llama.cpp's router vocabulary (GET
// /models status.value). The model layer maps napd's lifecycle onto it:
// awake, draining (and unsupported) are loaded; waking, also while it
// waits for GPU memory, is loading; asleep with a sleep mode that keeps
// the engine is sleeping; stopped, failed or not yet verified is
// unloaded. llama.cpp's downloading and downloaded are not napd's: napd
// downloads nothing.
type LoadState string

// Load states.
const (
	LoadUnloaded LoadState = "unloaded"
	LoadLoading  LoadState = "loading"
	LoadLoaded   LoadState = "loaded"
	LoadSleeping LoadState = "sleeping"
)

// Router is implemented by Models that load and unload models for the
// router API and tell when states change.
type Router interface {
	// Load wakes model as a request of client would, through napd's room
	// scheduling (the fit check, the waiting, fair turns), and returns at
	// once: the wake goes on without the caller, and its progress shows
	// in List. A failed model is reset first (a load is a new try).
	Load(model, client string) error
	// Unload puts model to sleep with its own strategy as napctl sleep
	// does (live requests drained first, the drain's rules honoured) and
	// returns once napd took the sleep up, or with why not.
	Unload(model string) error
	// Changes signals after a model's state (or load progress) changed;
	// signals coalesce. stop ends the subscription.
	Changes() (changed <-chan struct{}, stop func())
}

// DefaultStreamKeepAlive is how often an idle GET /models/sse gets a
// comment line, so that proxies and browsers keep it open.
const DefaultStreamKeepAlive = 15 * time.Second

// loadPoll is how often GET /models/sse looks again while a model loads:
// progress may move without a state change.
const loadPoll = time.Second

// routerStatus is an entry's status object (llama.cpp's shape).
type routerStatus struct {
	Value LoadState `json:"value"`
	// Args is the engine's command line: admins only (it names paths).
	Args []string `json:"args,omitempty"`
	// Failed, ExitCode and Reason say a failed model's failure (napd
	// keeps no exit status: 1 stands for "failed").
	Failed   bool          `json:"failed,omitempty"`
	ExitCode *int          `json:"exit_code,omitempty"`
	Reason   string        `json:"reason,omitempty"`
	Progress *loadProgress `json:"progress,omitempty"`
}

// loadProgress is how far a load got, from 0 to 1.
type loadProgress struct {
	Value float64 `json:"value"`
}

var exitFailed = 1

// status is m's status object; with args when the caller may see them.
func (c *call) status(m ModelInfo) routerStatus {
	s := routerStatus{Value: m.Load}
	if s.Value == "" {
		s.Value = LoadUnloaded
	}
	if c.seesArgs {
		s.Args = m.Args
	}
	if m.Failed {
		s.Failed, s.ExitCode, s.Reason = true, &exitFailed, m.Reason
	}
	if m.Progress != nil && s.Value == LoadLoading {
		s.Progress = &loadProgress{Value: *m.Progress}
	}
	return s
}

// modelCard is what llama.cpp says of a model: in each GET /models entry,
// and as a status_change to loaded's info.
type modelCard struct {
	ID      string   `json:"id"`
	Aliases []string `json:"aliases"`
	Tags    []string `json:"tags"`
	Object  string   `json:"object"`
	OwnedBy string   `json:"owned_by"`
	Created int64    `json:"created"`
}

// routerEntry is one entry of GET /models (llama.cpp's shape, with napd's
// own object as /v1/models has it).
type routerEntry struct {
	modelCard
	Status routerStatus `json:"status"`
	Napd   modelNapd    `json:"napd"`
}

func (c *call) routerEntry(m ModelInfo, alias string) routerEntry {
	e := c.entry(m, alias)
	aliases := m.Aliases
	if alias != "" || aliases == nil {
		aliases = []string{}
	}
	return routerEntry{modelCard: modelCard{ID: e.ID, Aliases: aliases, Tags: []string{}, Object: e.Object, OwnedBy: e.OwnedBy,
		Created: e.Created}, Status: e.Status, Napd: e.Napd}
}

// router serves the router API's paths on the shared socket.
func (c *call) router(r *http.Request) {
	c.seesArgs = c.isAdmin(r)
	rt, _ := c.g.models.(Router)
	method := http.MethodPost
	switch r.URL.Path {
	case "/models", "/models/sse":
		method = http.MethodGet
	case "/models/load", "/models/unload":
	default:
		c.fail(http.StatusNotFound, "not_found", "no route for "+r.URL.Path)
		return
	}
	switch {
	case r.Method != method:
		c.w.Header().Set("Allow", method)
		c.fail(http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path)
	case r.URL.Path == "/models":
		var list struct {
			Data   []routerEntry `json:"data"`
			Object string        `json:"object"`
		}
		list.Object, list.Data = "list", []routerEntry{}
		c.listed(c.g.models.List(), func(m ModelInfo, alias string) { list.Data = append(list.Data, c.routerEntry(m, alias)) })
		c.writeValue(http.StatusOK, list)
	case rt == nil:
		c.fail(http.StatusNotFound, "not_found", "no route for "+r.URL.Path)
	case r.URL.Path == "/models/sse":
		c.routerEvents(r, rt)
	default:
		c.loadOrUnload(r, rt, r.URL.Path == "/models/load")
	}
}

// isAdmin reports a caller who may see what admins see: an admin key, or
// without keys a loopback client.
func (c *call) isAdmin(r *http.Request) bool {
	if c.g.opts.APIKeys == nil {
		return isLoopback(r.RemoteAddr)
	}
	return c.scope != nil && c.scope.Role == RoleAdmin
}

// mayControl answers 403 (OpenAI's shape) unless the caller may load and
// unload models: an admin or control=true key, or without keys a loopback
// client.
func (c *call) mayControl(r *http.Request) bool {
	switch {
	case c.g.opts.APIKeys == nil && !isLoopback(r.RemoteAddr):
		c.fail(http.StatusForbidden, "control_loopback_only",
			r.URL.Path+" answers only clients on a loopback address while no api_keys_file is set")
		return false
	case c.scope != nil && !c.scope.mayControl():
		c.fail(http.StatusForbidden, "control_not_allowed",
			fmt.Sprintf("API key %q may not load or unload models: that needs role=admin or control=true", c.client))
		return false
	}
	return true
}

// loadOrUnload serves POST /models/load and /models/unload {"model": …}:
// {"success": true} once napd took the load (a wake) or the unload (a
// sleep) up; llama.cpp's 404 for a model napd does not have and 400 for
// one already running (load) or not running (unload).
func (c *call) loadOrUnload(r *http.Request, rt Router, load bool) {
	if !c.mayControl(r) {
		return
	}
	ctx, ok := c.deadline(r)
	if !ok {
		return
	}
	defer c.endDeadline()
	body, ok := c.readBody(ctx, r)
	if !ok {
		return
	}
	fields, err := parseBody(body)
	switch {
	case err != nil:
		c.llamaFail(http.StatusBadRequest, "request body is not a valid JSON object: "+err.Error())
		return
	case fields.Model == "":
		c.llamaFail(http.StatusBadRequest, `request body has no "model"`)
		return
	}
	model, known := c.g.models.Resolve(fields.Model)
	if !c.mayUse(fields.Model, model) {
		return
	}
	info, listed := c.info(model)
	if !known || !listed {
		c.llamaFail(http.StatusNotFound, "model is not found")
		return
	}
	c.model = model
	switch {
	case load && (info.Load == LoadLoaded || info.Load == LoadLoading):
		c.llamaFail(http.StatusBadRequest, "model is already running")
		return
	case load:
		err = rt.Load(model, c.client)
	case info.Load == LoadUnloaded || info.Load == LoadSleeping || info.Load == "":
		c.llamaFail(http.StatusBadRequest, "model is not running")
		return
	default:
		err = rt.Unload(model)
	}
	if err != nil {
		status := http.StatusBadRequest
		var ref *Refusal
		if errors.As(err, &ref) && ref.Status != 0 {
			status = ref.Status
		}
		c.llamaFail(status, err.Error())
		return
	}
	c.writeJSON(http.StatusOK, successBody)
}

var successBody = []byte(`{"success":true}`)

// info is the listed model's info.
func (c *call) info(model string) (ModelInfo, bool) {
	for _, m := range c.g.models.List() {
		if m.Name == model {
			return m, true
		}
	}
	return ModelInfo{}, false
}

// llamaError is llama.cpp's error shape, which its router API's clients
// read: a numeric code.
type llamaError struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

func (c *call) llamaFail(status int, msg string) {
	var e llamaError
	e.Error.Code, e.Error.Message, e.Error.Type = status, msg, "invalid_request_error"
	switch {
	case status == http.StatusNotFound:
		e.Error.Type = "not_found_error"
	case status == http.StatusServiceUnavailable:
		e.Error.Type = "unavailable_error"
	case status >= 500:
		e.Error.Type = "server_error"
	}
	c.writeValue(status, e)
}

// routerEvent is one event of GET /models/sse (llama.cpp's shape).
type routerEvent struct {
	Model string     `json:"model"`
	Event string     `json:"event"`
	Data  *eventData `json:"data,omitempty"`
}

type eventData struct {
	Status   LoadState     `json:"status"`
	Progress *loadProgress `json:"progress,omitempty"`
	Info     *modelCard    `json:"info,omitempty"`
	ExitCode *int          `json:"exit_code,omitempty"`
	Failed   bool          `json:"failed,omitempty"`
	Reason   string        `json:"reason,omitempty"`
}

var exitClean = 0

// routerEvents serves GET /models/sse: first a model_status event for
// every model the caller may see (its status now), then, at every change,
// a status_change for each model whose status changed (model_status
// first when it starts loading, its progress while it loads when napd
// knows it, model_remove when a reload removed it), and a comment every
// StreamKeepAlive. Each client holds at most a few such streams (the
// StreamLimit); what a slow client has not read is never queued (a
// change is a signal, the events are computed when it is written), and a
// client that stops reading is cut by the write timeout. The stream ends
// cleanly when napd stops.
func (c *call) routerEvents(r *http.Request, rt Router) {
	who := c.client
	if c.g.opts.APIKeys == nil {
		who, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	if !c.g.streams.acquire(who) {
		c.w.Header().Set("Retry-After", "10")
		c.fail(http.StatusTooManyRequests, "too_many_streams",
			fmt.Sprintf("this client already has %d event streams open (at most %d each, %d in all)", c.g.streams.open(who), c.g.streams.perClient, c.g.streams.total))
		return
	}
	defer c.g.streams.release(who)
	changed, stop := rt.Changes()
	defer stop()
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)

	every := c.g.opts.StreamKeepAlive
	if every <= 0 {
		every = DefaultStreamKeepAlive
	}
	keep := time.NewTicker(every)
	defer keep.Stop()
	poll := time.NewTimer(loadPoll)
	defer poll.Stop()
	d := eventDiff{sent: map[string]routerStatus{}}
	for {
		loading, err := d.write(c, &c.w)
		if err == nil {
			err = c.w.FlushError()
		}
		if err != nil {
			return
		}
		if loading {
			poll.Reset(loadPoll)
		} else {
			poll.Stop()
		}
		select {
		case <-r.Context().Done():
			return
		case <-c.g.opts.Stopping:
			return
		case <-changed:
		case <-poll.C:
		case <-keep.C:
			if _, err := c.w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
		}
	}
}

// eventDiff is what a stream told its client last, per entry.
type eventDiff struct {
	sent    map[string]routerStatus
	started bool
}

// write sends the events since the last call: every status at first,
// then the changes. It reports whether a model is loading (its progress
// is worth a look soon).
func (d *eventDiff) write(c *call, w *recorder) (loading bool, err error) {
	type entry struct {
		m     ModelInfo
		id    string
		alias string
	}
	var now []entry
	c.listed(c.g.models.List(), func(m ModelInfo, alias string) {
		id := m.Name
		if alias != "" {
			id = alias
		}
		now = append(now, entry{m, id, alias})
	})
	var events []routerEvent
	seen := make(map[string]bool, len(now))
	for _, e := range now {
		seen[e.id] = true
		st := c.status(e.m)
		st.Args = nil
		loading = loading || st.Value == LoadLoading
		prev, had := d.sent[e.id]
		d.sent[e.id] = st
		switch {
		case !d.started || !had:
			events = append(events, routerEvent{e.id, "model_status", &eventData{Status: st.Value}})
		case sameStatus(prev, st):
			continue
		default:
			if st.Value == LoadLoading && prev.Value != LoadLoading {
				events = append(events, routerEvent{e.id, "model_status", &eventData{Status: st.Value}})
			}
			events = append(events, routerEvent{e.id, "status_change", changeData(c, e.m, e.alias, st)})
		}
	}
	for id := range d.sent {
		if !seen[id] {
			delete(d.sent, id)
			events = append(events, routerEvent{Model: id, Event: "model_remove"})
		}
	}
	d.started = true
	for _, ev := range events {
		b, _ := json.Marshal(ev) // plain structs of strings and numbers
		if _, err := w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
			return loading, err
		}
	}
	return loading, nil
}

func sameStatus(a, b routerStatus) bool {
	pa, pb := -1.0, -1.0
	if a.Progress != nil {
		pa = a.Progress.Value
	}
	if b.Progress != nil {
		pb = b.Progress.Value
	}
	return a.Value == b.Value && a.Failed == b.Failed && a.Reason == b.Reason && pa == pb
}

// changeData is a status_change's data: what llama.cpp sends with each
// status (the info once loaded, the exit code once unloaded).
func changeData(c *call, m ModelInfo, alias string, st routerStatus) *eventData {
	d := &eventData{Status: st.Value, Progress: st.Progress}
	switch st.Value {
	case LoadLoaded:
		card := c.routerEntry(m, alias).modelCard
		d.Info = &card
	case LoadUnloaded:
		d.ExitCode = &exitClean
		if st.Failed {
			d.ExitCode, d.Failed, d.Reason = &exitFailed, true, st.Reason
		}
	}
	return d
}

// isRouterPath reports a path of the router API.
func isRouterPath(path string) bool { return path == "/models" || strings.HasPrefix(path, "/models/") }
