// Package remote is napd's models served elsewhere (docs/remote.md): a
// model with a url has no engine here, no supervisor, no sleep and no
// placement. napd routes to it, applies keys and scopes, counts its
// requests and tokens, holds its max_concurrency and queue, rewrites its
// model name (served_name), and sends napd's credential in place of the
// client's; a local model's overflow sends it requests napd cannot serve
// here in time (agent/model).
//
// A remote model is awake while it answers and unverified after
// health_failures failures in a row, of its health checks (a GET of its
// health path every health_interval) or of the requests sent to it; a
// remote that is another napd says its model's state in its /v1/models
// answer, which status shows as remote_state.
//
// It owns each remote's admission (slots and the line waiting for one),
// its health and its link (transport and credential). It must not start,
// stop or place anything, and it knows no other model.
package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/gateway"
)

// Deps is what a remote model uses from the rest of napd.
type Deps struct {
	Tracker *lease.Tracker
	// Clock is napd's clock: leases, health checks and states are dated
	// with it.
	Clock func() time.Time
	// Emit receives the model's state changes; StatusChanged is told of
	// them (systemd's STATUS=). Neither may block.
	Emit          func(control.Event)
	StatusChanged func()
	Log           *slog.Logger
	// Ctx is napd's lifetime: health checks in flight end with it.
	Ctx context.Context
}

// CheckTimeout bounds one health check (and at most health_interval).
const CheckTimeout = 10 * time.Second

// maxHealthBody bounds what is read of a health check's answer: another
// napd's /v1/models with a few thousand models fits.
const maxHealthBody = 4 << 20

// ErrUnavailable: the remote cannot take an overflowed request now (it is
// not awake, its napd says the model failed, or its line is full); the
// next overflow target is tried.
var ErrUnavailable = errors.New("the overflow target cannot take the request now")

// Model is one remote model.
type Model struct {
	name string
	d    Deps
	log  *slog.Logger

	mu     sync.Mutex
	link   *Link
	active int     // requests granted a slot
	line   []*slot // waiting for one, in arrival order
	h      health
	// probing: a health check is in flight; next is when the next is due.
	probing bool
	next    time.Time
}

// slot is one request's place: granted, or waiting in the line.
type slot struct {
	link    *Link
	ready   chan struct{} // closed when granted
	granted bool
}

// health is what napd knows of a remote's answers.
type health struct {
	state    lifecycle.State // Awake or Unverified
	reason   string
	since    time.Time
	failures int // in a row
	// remote is what a remote napd says of the model (its napd.state);
	// "" when it is no napd or did not say.
	remote string
}

// Snapshot is a remote model's state, for status, metrics and /v1/models.
type Snapshot struct {
	Config      *config.Model
	State       lifecycle.State
	Reason      string
	Since       time.Time
	RemoteState string
	Active      int
	QueueDepth  int
}

// New returns the remote model reached through l.
func New(d Deps, l *Link) *Model {
	m := &Model{name: l.cfg.Name, d: d, log: d.Log.With("model", l.cfg.Name), link: l}
	now := d.Clock()
	d.Tracker.Register(m.name, now)
	m.h = initial(l.cfg, now)
	return m
}

// initial is a remote's health before its first answer: unverified until
// its first health check, or awake when it is never checked (its
// requests tell then).
func initial(cfg *config.Model, now time.Time) health {
	if cfg.HealthInterval > 0 {
		return health{state: lifecycle.Unverified, reason: "not checked yet", since: now}
	}
	return health{state: lifecycle.Awake, since: now}
}

// Name is the model's configured name.
func (m *Model) Name() string { return m.name }

func (m *Model) now() time.Time { return m.d.Clock() }

// Snapshot is the model's state now.
func (m *Model) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Snapshot{Config: m.link.cfg, State: m.h.state, Reason: m.h.reason, Since: m.h.since,
		RemoteState: m.h.remote, Active: m.active, QueueDepth: len(m.line)}
}

// QueueDepth is how many requests wait for a slot.
func (m *Model) QueueDepth() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.line)
}

// Reconfigure makes l (a reloaded config) the link of the requests
// granted from now on; requests under way finish on theirs. A remote
// reached elsewhere than before (url, CA, credential) is checked afresh.
func (m *Model) Reconfigure(l *Link) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.link
	m.link = l
	if old.root.String() != l.root.String() || old.health.String() != l.health.String() || old.cfg.TLSCAFile != l.cfg.TLSCAFile ||
		!reflect.DeepEqual(old.remote.Credential, l.remote.Credential) || old.cfg.HealthInterval != l.cfg.HealthInterval {
		m.set(initial(l.cfg, m.now()))
		m.next = time.Time{}
	}
	old.Close()
	m.dispatch() // max_concurrency may have grown
}

// Close ends the model's idle connections (removed by a reload); requests
// under way finish.
func (m *Model) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.link.Close()
}

// Admit takes a lease for a request to the remote and a slot for it,
// waiting in line within ctx (see gateway.Models.Admit). A full line is
// a 503, as a local model's full queue is.
func (m *Model) Admit(ctx context.Context, req lease.Request) (*gateway.Ticket, error) {
	req.Model = m.name
	adm, replay, err := model.BeginLease(ctx, m.d.Tracker, m.d.Clock, req)
	if adm.Verdict != lease.Started {
		return replay, err
	}
	s, err := m.reserve(false)
	if err == nil {
		err = m.wait(ctx, s)
	}
	if err != nil {
		m.d.Tracker.End(m.now(), adm.ID, lease.Outcome{Cancelled: true})
		return nil, err
	}
	return m.ticket(s, adm.ID, ""), nil
}

// Adopt takes an overflowed request whose lease id was begun for another
// model: it moves the lease here (lease.Tracker.Move) and waits in line
// within ctx. It fails with ErrUnavailable, moving nothing, when the
// remote cannot take the request now; any other error comes after the
// move, and the lease has then ended here.
func (m *Model) Adopt(ctx context.Context, id lease.ID) (*gateway.Ticket, lease.Moved, error) {
	s, err := m.reserve(true)
	if err != nil {
		return nil, lease.Moved{}, err
	}
	moved, err := m.d.Tracker.Move(m.now(), id, m.name)
	if err != nil {
		m.unreserve(s)
		return nil, lease.Moved{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if err := m.wait(ctx, s); err != nil {
		m.d.Tracker.End(m.now(), id, lease.Outcome{Cancelled: true})
		return nil, moved, err
	}
	return m.ticket(s, id, m.name), moved, nil
}

// reserve takes a slot, or a place in the line; an overflow is refused
// (ErrUnavailable) by a remote that does not answer or whose line is
// full, a request of its own only by a full line.
func (m *Model) reserve(overflow bool) (*slot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cfg := m.link.cfg
	if overflow && (m.h.state != lifecycle.Awake || m.h.remote == lifecycle.Failed.String()) {
		return nil, ErrUnavailable
	}
	s := &slot{link: m.link, ready: make(chan struct{})}
	if len(m.line) == 0 && m.active < cfg.MaxConcurrency {
		m.grant(s)
		return s, nil
	}
	if len(m.line) >= cfg.Queue {
		if overflow {
			return nil, ErrUnavailable
		}
		return nil, &gateway.Refusal{Status: http.StatusServiceUnavailable, Code: gateway.CodeQueueFull,
			Message:    fmt.Sprintf("remote model %s: queue full (%d waiting, %d in flight)", m.name, len(m.line), m.active),
			RetryAfter: lifecycle.MinRetryAfter}
	}
	m.line = append(m.line, s)
	return s, nil
}

// grant gives s a slot; m.mu is held.
func (m *Model) grant(s *slot) {
	m.active++
	s.granted = true
	s.link = m.link
	close(s.ready)
}

// dispatch grants the line while slots are free; m.mu is held.
func (m *Model) dispatch() {
	for len(m.line) > 0 && m.active < m.link.cfg.MaxConcurrency {
		s := m.line[0]
		m.line = m.line[1:]
		m.grant(s)
	}
}

// wait waits, within ctx, for s's slot; a request that leaves gives up
// its place (or the slot granted meanwhile).
func (m *Model) wait(ctx context.Context, s *slot) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		m.unreserve(s)
		return ctx.Err()
	}
}

// unreserve gives back s's slot or place in line.
func (m *Model) unreserve(s *slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.granted {
		m.active--
		m.dispatch()
		return
	}
	if i := slices.Index(m.line, s); i >= 0 {
		m.line = slices.Delete(m.line, i, i+1)
	}
}

// ticket is the gateway's ticket for lease id in slot s; servedBy is set
// for an overflowed request.
func (m *Model) ticket(s *slot, id lease.ID, servedBy string) *gateway.Ticket {
	l := s.link
	var once sync.Once
	return &gateway.Ticket{Target: l.root, Transport: l.tr, ServedName: l.cfg.ServedName, Remote: l.remote, ServedBy: servedBy,
		Done: func(o gateway.Outcome) { once.Do(func() { m.end(s, id, o) }) }}
}

// end releases a request's lease and slot and learns from how it went:
// an answer is the remote answering, a failed connection or a cut answer
// a failure (and a health check soon).
func (m *Model) end(s *slot, id lease.ID, o gateway.Outcome) {
	m.d.Tracker.End(m.now(), id, o.Outcome)
	m.unreserve(s)
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.link != m.link {
		return // about a link reconfigured since
	}
	switch {
	case o.Fault != gateway.FaultNone:
		m.failed("a request failed: " + o.Fault.String())
		m.next = m.now()
	case !o.Cancelled:
		m.answered("")
	}
}

// Tick starts a health check when one is due (napd's ticker calls it
// every second).
func (m *Model) Tick() {
	m.mu.Lock()
	l := m.link
	due := l.cfg.HealthInterval > 0 && !m.probing && !m.now().Before(m.next)
	m.probing = m.probing || due
	m.mu.Unlock()
	if due {
		go m.check(m.d.Ctx, l)
	}
}

// check runs one health check of l and applies its answer.
func (m *Model) check(ctx context.Context, l *Link) {
	ctx, cancel := context.WithTimeout(ctx, min(CheckTimeout, l.cfg.HealthInterval))
	defer cancel()
	state, err := l.check(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.probing = false
	if l != m.link {
		return // reconfigured meanwhile: the new link is checked next
	}
	m.next = m.now().Add(l.cfg.HealthInterval)
	if err != nil {
		m.failed(fmt.Sprintf("health check GET %s: %v", l.cfg.Health, err))
		return
	}
	m.answered(state)
}

// answered notes an answer of the remote (state: what a remote napd said
// of the model, "" when nothing); m.mu is held.
func (m *Model) answered(state string) {
	h := m.h
	h.failures, h.state, h.reason = 0, lifecycle.Awake, ""
	if state != "" || h.remote != "" {
		h.remote = state
	}
	m.set(h)
}

// failed notes a failure; health_failures of them in a row make the
// remote unverified; m.mu is held.
func (m *Model) failed(why string) {
	h := m.h
	h.failures++
	if h.state != lifecycle.Awake || h.failures >= max(m.link.cfg.HealthFailures, 1) {
		h.state, h.remote = lifecycle.Unverified, ""
		h.reason = fmt.Sprintf("%s (%d in a row)", why, h.failures)
	}
	m.set(h)
}

// set makes h the model's health, announcing a change of state; m.mu is
// held.
func (m *Model) set(h health) {
	before := m.h
	if h.state != before.state {
		h.since = m.now()
	}
	m.h = h
	if h.state == before.state && h.remote == before.remote {
		return
	}
	m.log.Info("state changed", "from", before.state.String(), "state", h.state.String(), "reason", h.reason, "remote_state", h.remote)
	if m.d.Emit != nil {
		reason := h.reason
		if reason == "" && h.remote != "" {
			reason = "remote_state " + h.remote
		}
		m.d.Emit(control.Event{Time: time.Now(), Model: m.name, Kind: control.EventState,
			From: before.state.String(), To: h.state.String(), Reason: reason})
	}
	if m.d.StatusChanged != nil {
		m.d.StatusChanged()
	}
}

// check asks the remote's health path, with napd's credential; a 2xx is
// an answer. From an OpenAI model list it reads what a remote napd says
// of the model (napdState).
func (l *Link) check(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.health.String(), nil)
	if err != nil {
		return "", err
	}
	for k, v := range l.remote.Credential {
		req.Header[k] = v
	}
	resp, err := l.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // not the URL again
		}
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHealthBody))
	if err != nil {
		return "", fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("answered %d", resp.StatusCode)
	}
	id := l.cfg.ServedName
	if id == "" {
		id = l.cfg.Name
	}
	return napdState(body, id), nil
}

// napdState is the napd.state of model id in another napd's /v1/models
// answer; "" when body is not such a list, does not list id or says
// nothing napd's states look like (it is shown in status as it is).
func napdState(body []byte, id string) string {
	var list struct {
		Data []struct {
			ID   string `json:"id"`
			Napd *struct {
				State string `json:"state"`
			} `json:"napd"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &list) != nil {
		return ""
	}
	for _, e := range list.Data {
		if e.ID == id && e.Napd != nil && stateWord.MatchString(e.Napd.State) {
			return e.Napd.State
		}
	}
	return ""
}

// stateWord is what a lifecycle state's name looks like.
var stateWord = regexp.MustCompile(`^[a-z][a-z-]{0,31}$`)
