package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"reflect"
	"slices"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/logging"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// registry is the set of models of one config generation. It is replaced
// whole on reload (copy-on-write) and read lock-free by the gateway.
type registry struct {
	list    []*model
	byName  map[string]*model
	aliases map[string]string
}

func (r *registry) resolve(name string) (*model, bool) {
	if m, ok := r.byName[name]; ok {
		return m, true
	}
	if n, ok := r.aliases[name]; ok {
		return r.byName[n], true
	}
	return nil, false
}

// buildRegistry makes the registry for cfg. Models present in old with an
// unchanged engine spec keep their loop (and engine); changed ones are
// reconfigured; new ones get a loop.
func (a *Agent) buildRegistry(cfg *config.Config, old *registry) (*registry, error) {
	r := &registry{byName: make(map[string]*model), aliases: make(map[string]string)}
	prevOf := func(name string) *model {
		if old == nil {
			return nil
		}
		return old.byName[name]
	}
	// Ports first: the only step that can fail, so a failure leaves the
	// running models untouched and starts no loop.
	ports := make([]int, len(cfg.Models))
	for i, mc := range cfg.Models {
		p, err := a.portFor(mc, prevOf(mc.Name))
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	now := a.clock()
	for i, mc := range cfg.Models {
		prev := prevOf(mc.Name)
		spec := specOf(mc, ports[i])
		var m *model
		if prev != nil {
			m = prev
			m.call(func() { m.reconfigure(mc, spec, now) })
		} else {
			m = newModel(a, mc, spec, a.transportFor(mc, spec), now)
			a.tracker.Register(mc.Name, now)
			a.loops.Add(1)
			go func() { defer a.loops.Done(); m.run() }()
		}
		r.list = append(r.list, m)
		r.byName[mc.Name] = m
		for _, al := range mc.Aliases {
			r.aliases[al] = mc.Name
		}
	}
	return r, nil
}

// portFor is the port of a model's engine: the configured one, else the one
// napd allocated before — by an earlier config generation, or by an earlier
// napd whose engine unit still runs and is about to be adopted (remembered
// in state_dir) — else a free one, remembered for next time.
func (a *Agent) portFor(mc *config.Model, prev *model) (int, error) {
	if mc.Port != 0 {
		return mc.Port, nil
	}
	if prev != nil && prev.cfg.Port == 0 {
		return prev.spec.Port, nil
	}
	if p, ok := a.ports.Get(mc.Name); ok {
		return int(p), nil
	}
	p, err := config.FreePort()
	if err != nil {
		return 0, fmt.Errorf("model %s: allocate a port: %w", mc.Name, err)
	}
	if err := a.ports.Remember(mc.Name, int64(p)); err != nil {
		a.log.Warn("remembering the allocated port", "model", mc.Name, "err", err)
	}
	return p, nil
}

// specOf builds the supervisor's spec for a model on port.
func specOf(mc *config.Model, port int) supervisor.Spec {
	var cmd []string
	var env map[string]string
	if len(mc.Command) > 0 || len(mc.Environment) > 0 {
		cmd, env = mc.ExpandPort(port)
	}
	return supervisor.Spec{
		Model:            mc.Name,
		Command:          cmd,
		Unit:             mc.Unit,
		Port:             port,
		Environment:      env,
		GPUs:             mc.GPUs,
		WorkingDirectory: mc.WorkingDirectory,
		User:             engineUser(mc.User),
		Health:           mc.Health,
		Sleep:            mc.Sleep,
		StopTimeout:      mc.StopTimeout,
	}
}

// DefaultEngineUser is the account engines run as when a model sets no
// user and napd runs as root: the package creates it (sysusers.d), so an
// engine does not get root's power by default.
const DefaultEngineUser = "napd-engine"

// engineUser is the user an engine runs as: the model's, else
// DefaultEngineUser when napd is root and that account exists, else napd's
// own (a developer running napd as themselves).
func engineUser(configured string) string {
	if configured != "" || os.Geteuid() != 0 {
		return configured
	}
	if _, err := user.Lookup(DefaultEngineUser); err == nil {
		return DefaultEngineUser
	}
	return ""
}

// transportFor is the round tripper requests to the model's engine use: one
// tuned transport per engine on loopback, or the connection to a ZMQ worker.
func (a *Agent) transportFor(mc *config.Model, _ supervisor.Spec) http.RoundTripper {
	if mc.Transport == config.TransportZMQ {
		return a.newZMQEngine(mc)
	}
	return &http.Transport{
		Proxy:                 nil, // loopback: never through a proxy
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // the request's deadline governs
		ForceAttemptHTTP2:     false,
	}
}

// reconfigure applies a reloaded config to a model that stays. Policy
// changes apply at once; an engine spec change restarts the engine once
// the model is idle, so no request is cut.
func (m *model) reconfigure(mc *config.Model, spec supervisor.Spec, now time.Time) {
	specChanged := !reflect.DeepEqual(spec, m.spec)
	if mc.Transport != m.cfg.Transport || mc.Address != m.cfg.Address {
		// The running engine keeps its transport until it is restarted.
		closeTransport(m.nextTr)
		m.nextTr = m.a.transportFor(mc, spec)
		specChanged = true
	}
	m.cfg = mc
	m.machine.Reload(now, policyOf(mc))
	if specChanged {
		m.spec = spec
		m.restart = true
		m.log.Info("engine settings changed: the engine restarts once idle")
		m.afterIdle()
	}
	m.dispatch() // max_concurrency may have grown
	m.publish()
}

// retire marks a model removed by a reload: its engine is stopped once its
// last lease ends, then its loop ends.
func (m *model) retire() {
	m.retiring = true
	for _, q := range m.queue {
		q.reply <- grant{err: m.removed()}
	}
	m.queue = nil
	m.afterIdle()
	m.publish()
}

// retired is called once a removed model's engine is stopped.
func (a *Agent) retired(m *model) {
	a.metrics.Forget(m.name)
	closeTransport(m.tr)
	closeTransport(m.nextTr)
	m.log.Info("model removed")
	m.shutdown()
}

// observe reconciles one model from what the supervisor finds.
func (m *model) observe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	obs, err := m.a.sup.Observe(ctx, m.spec)
	report := lifecycle.ReportNoAnswer
	switch {
	case err != nil:
		m.log.Warn("cannot observe engine", "err", err)
	case obs.State == supervisor.Awake:
		report = lifecycle.ReportServing
	case obs.State == supervisor.Asleep || obs.State == supervisor.Stopped:
		report = lifecycle.ReportAsleep
	}
	m.call(func() {
		m.machine.Reconcile(m.now(), report)
		m.noteState()
		m.publish()
	})
	m.log.Info("reconciled", "found", obs.State.String(), "reason", obs.Reason)
}

// Reload re-reads the config file. An invalid file is refused and the
// running config stays; otherwise models are added, removed (stopped after
// their leases end) or changed, and no request is dropped.
func (a *Agent) Reload() error {
	a.regMu.Lock()
	defer a.regMu.Unlock()
	a.notify.reloading()
	defer a.notify.ready()
	old := a.cfg.Load()
	cfg, err := config.Load(old.Path)
	if err != nil {
		a.metrics.Reloads.WithLabelValues("invalid").Inc()
		a.log.Error("config reload refused", "config", old.Path, "err", err)
		return err
	}
	if lvl, err := logging.ParseLevel(cfg.Agent.LogLevel); err == nil {
		a.level.Set(lvl)
	}
	if restartOnly := restartOnlyChanges(old, cfg); len(restartOnly) > 0 {
		a.log.Warn("config changes that take effect only at restart", "keys", restartOnly)
	}
	if err := a.setGateway(cfg); err != nil {
		a.metrics.Reloads.WithLabelValues("invalid").Inc()
		return err
	}
	oldReg := a.reg.Load()
	reg, err := a.buildRegistry(cfg, oldReg)
	if err != nil {
		a.metrics.Reloads.WithLabelValues("invalid").Inc()
		return err
	}
	var added []*model
	for _, m := range reg.list {
		if oldReg.byName[m.name] == nil {
			added = append(added, m)
		}
	}
	a.cfg.Store(cfg)
	a.reg.Store(reg)
	for _, m := range oldReg.list {
		if reg.byName[m.name] == nil {
			m.do(m.retire)
		}
	}
	for _, m := range added {
		go m.observe(a.ctx)
	}
	a.metrics.Reloads.WithLabelValues("ok").Inc()
	a.log.Info("config reloaded", "config", cfg.Path, "models", len(reg.list), "added", len(added))
	a.publishEvent(control.Event{Time: time.Now(), Kind: "reload", Reason: fmt.Sprintf("%d models", len(reg.list))})
	a.kickStatus()
	return nil
}

// restartOnlyChanges lists changed keys a reload cannot apply: listeners and
// the supervisor are bound at start.
func restartOnlyChanges(old, cfg *config.Config) []string {
	var keys []string
	if old.Agent.Supervisor != cfg.Agent.Supervisor {
		keys = append(keys, "agent.supervisor")
	}
	if old.Agent.StateDir != cfg.Agent.StateDir {
		keys = append(keys, "agent.state_dir")
	}
	if old.Agent.ControlSocket != cfg.Agent.ControlSocket {
		keys = append(keys, "agent.control_socket")
	}
	if old.Agent.MetricsListen != cfg.Agent.MetricsListen {
		keys = append(keys, "agent.metrics_listen")
	}
	if old.Agent.EventsAddress != cfg.Agent.EventsAddress {
		keys = append(keys, "agent.events_address")
	}
	if old.Agent.HAProxyAgentListen != cfg.Agent.HAProxyAgentListen {
		keys = append(keys, "agent.haproxy_agent_listen")
	}
	if !slices.Equal(old.Gateway.Listen, cfg.Gateway.Listen) {
		keys = append(keys, "gateway.listen")
	}
	if old.Gateway.KeepaliveTimeout != cfg.Gateway.KeepaliveTimeout {
		keys = append(keys, "gateway.keepalive_timeout")
	}
	if old.Gateway.MaxConnections != cfg.Gateway.MaxConnections {
		keys = append(keys, "gateway.max_connections")
	}
	oldListen := make(map[string]string)
	for _, m := range old.Models {
		oldListen[m.Name] = m.Listen
	}
	for _, m := range cfg.Models {
		if m.Listen != "" && oldListen[m.Name] != m.Listen {
			keys = append(keys, "models."+m.Name+".listen")
		}
	}
	return keys
}

// gatewayModels is the Agent as the gateway sees it.
type gatewayModels Agent

func (g *gatewayModels) agent() *Agent { return (*Agent)(g) }

// Resolve implements gateway.Models.
func (g *gatewayModels) Resolve(name string) (string, bool) {
	m, ok := g.agent().reg.Load().resolve(name)
	if !ok {
		return "", false
	}
	return m.name, true
}

// List implements gateway.Models.
func (g *gatewayModels) List() []gateway.ModelInfo {
	reg := g.agent().reg.Load()
	out := make([]gateway.ModelInfo, 0, len(reg.list))
	for _, m := range reg.list {
		s := m.snap.Load()
		out = append(out, gateway.ModelInfo{Name: m.name, Aliases: s.cfg.Aliases, State: s.lc.State.String(), Reason: s.lc.Reason,
			Serving: s.lc.State.Serving()})
	}
	return out
}

// Admit implements gateway.Models.
func (g *gatewayModels) Admit(ctx context.Context, a gateway.Admission) (*gateway.Ticket, error) {
	m, ok := g.agent().reg.Load().byName[a.Model]
	if !ok {
		return nil, &gateway.Refusal{Status: http.StatusNotFound, Code: "model_not_found",
			Message: fmt.Sprintf("model %q does not exist", a.Model)}
	}
	t, err := m.admit(ctx, a)
	if t != nil && t.Target != nil {
		t.ServedName = m.snap.Load().cfg.ServedName
	}
	return t, err
}

// QueueDepth implements gateway.Models.
func (g *gatewayModels) QueueDepth(model string) int {
	m, ok := g.agent().reg.Load().byName[model]
	if !ok {
		return 0
	}
	return m.snap.Load().queueDepth
}
