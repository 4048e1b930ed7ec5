package agent

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/logging"
	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/remote"
	"github.com/napd/napd/agent/room"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/supervisor"
)

// registry is the set of models of one config generation. It is replaced
// whole on reload (copy-on-write) and read lock-free by the gateway.
type registry struct {
	list    []*model.Model
	desk    []room.Model // list, as the make-room desk sees it
	byName  map[string]*model.Model
	aliases map[string]string // of local and remote models
	// The models served elsewhere (url): no loop, no engine.
	remotes    []*remote.Model
	remoteName map[string]*remote.Model
}

// resolve finds the local model a name or alias names.
func (r *registry) resolve(name string) (*model.Model, bool) {
	if m, ok := r.byName[name]; ok {
		return m, true
	}
	m := r.byName[r.aliases[name]]
	return m, m != nil
}

// resolveName is the name of the model, local or remote, a name or alias
// names.
func (r *registry) resolveName(name string) (string, bool) {
	if n, ok := r.aliases[name]; ok {
		return n, true
	}
	_, local := r.byName[name]
	_, remote := r.remoteName[name]
	return name, local || remote
}

// registryPlan is what a config generation's registry needs, computed
// before anything changes: the engine spec of every model, and the ports
// napd allocated for it to remember once the plan is applied.
type registryPlan struct {
	cfg      *config.Config
	specs    map[string]supervisor.Spec
	allocate map[string]int          // model -> newly allocated port
	links    map[string]*remote.Link // of the remote models
}

// planRegistry computes the registry of cfg next to old (nil at start).
// It changes nothing: a failure leaves the running models untouched.
func (a *Agent) planRegistry(cfg *config.Config, old *registry) (*registryPlan, error) {
	p := &registryPlan{cfg: cfg, specs: make(map[string]supervisor.Spec), allocate: make(map[string]int), links: make(map[string]*remote.Link)}
	for _, mc := range cfg.Models {
		if mc.Remote() {
			link, err := remote.NewLink(mc)
			if err != nil {
				return nil, err
			}
			p.links[mc.Name] = link
			continue
		}
		var prev *model.Model
		if old != nil {
			prev = old.byName[mc.Name]
		}
		port, fresh, err := a.portFor(mc, prev)
		if err != nil {
			return nil, err
		}
		if fresh {
			p.allocate[mc.Name] = port
		}
		p.specs[mc.Name] = model.SpecOf(mc, port)
	}
	return p, nil
}

// applyRegistry makes the registry of a plan. Models present in old keep
// their loop (and engine) and are reconfigured; new ones get a loop, whose
// engine the caller observes.
func (a *Agent) applyRegistry(p *registryPlan, old *registry) *registry {
	for name, port := range p.allocate {
		if err := a.ports.Remember(name, int64(port)); err != nil {
			a.log.Warn("remembering the allocated port", "model", name, "err", err)
		}
	}
	r := &registry{byName: make(map[string]*model.Model), aliases: make(map[string]string), remoteName: make(map[string]*remote.Model)}
	for _, mc := range p.cfg.Models {
		for _, al := range mc.Aliases {
			r.aliases[al] = mc.Name
		}
		if mc.Remote() {
			a.applyRemote(r, p.links[mc.Name], old)
			continue
		}
		spec := p.specs[mc.Name]
		var m *model.Model
		if old != nil {
			m = old.byName[mc.Name]
		}
		if m != nil {
			m.Reconfigure(mc, spec)
		} else {
			m = model.New(a.modelDeps(), mc, spec)
			a.loops.Add(1)
			go func() { defer a.loops.Done(); m.Run() }()
		}
		r.list = append(r.list, m)
		r.desk = append(r.desk, m)
		r.byName[mc.Name] = m
	}
	return r
}

// modelDeps is what a model's loop gets from the agent.
func (a *Agent) modelDeps() model.Deps {
	return model.Deps{
		Tracker:       a.tracker,
		Supervisor:    a.sup,
		Metrics:       a.metrics,
		Emit:          a.hub.Publish,
		StatusChanged: a.statusChanged,
		Clock:         a.clock,
		MakeRoom:      a.desk.MakeRoom,
		GPUDevices:    a.prober.GPUDevices,
		WaitingFor:    a.desk.WaitingFor,
		Idle:          a.desk.ModelIdle,
		Probe:         a.prober.ProbeEngine,
		Overflow:      a.overflow,
		Log:           a.log,
		Ctx:           a.ctx,
		Usage:         a.usage,
		Load:          measure.LoadMeter{Supervisor: a.sup},
	}
}

// portFor is the port of a model's engine: the configured one, else the one
// napd allocated before — by an earlier config generation, or by an earlier
// napd whose engine unit still runs and is about to be adopted (remembered
// in state_dir) — else a free one (fresh: to be remembered).
func (a *Agent) portFor(mc *config.Model, prev *model.Model) (port int, fresh bool, err error) {
	if mc.Port != 0 {
		return mc.Port, false, nil
	}
	if prev != nil {
		if s := prev.Snapshot(); s.Config.Port == 0 {
			return s.Spec.Port, false, nil
		}
	}
	if p, ok := a.ports.Get(mc.Name); ok {
		return int(p), false, nil
	}
	p, err := config.FreePort()
	if err != nil {
		return 0, false, fmt.Errorf("model %s: allocate a port: %w", mc.Name, err)
	}
	return p, true, nil
}

// Reload re-reads the config file. Everything the new config needs (log
// level, gateway settings and API keys, ports, engine specs) is built
// first; a config that fails any step is refused and changes nothing.
// Otherwise models are added, removed (stopped after their leases end) or
// changed, and no request is dropped.
func (a *Agent) Reload() error {
	a.regMu.Lock()
	defer a.regMu.Unlock()
	a.notify.Reloading()
	defer a.notify.Ready()
	old := a.cfg.Load()
	refuse := func(err error) error {
		a.metrics.Reloads.WithLabelValues("invalid").Inc()
		a.log.Error("config reload refused", "config", old.Path, "err", err)
		return err
	}
	cfg, err := config.Load(old.Path)
	if err != nil {
		return refuse(err)
	}
	lvl, err := logging.ParseLevel(cfg.Agent.LogLevel)
	if err != nil {
		return refuse(err)
	}
	gw, err := a.newGateway(cfg)
	if err != nil {
		return refuse(err)
	}
	oldReg := a.reg.Load()
	plan, err := a.planRegistry(cfg, oldReg)
	if err != nil {
		return refuse(err)
	}

	// Nothing below fails.
	a.level.Set(lvl)
	warnConfig(a.log, cfg)
	if restartOnly := config.RestartOnly(old, cfg); len(restartOnly) > 0 {
		a.log.Warn("config changes that take effect only at restart", "keys", restartOnly)
	}
	a.setGateway(gw)
	reg := a.applyRegistry(plan, oldReg)
	var added []*model.Model
	for _, m := range reg.list {
		if oldReg.byName[m.Name()] == nil {
			added = append(added, m)
		}
	}
	a.cfg.Store(cfg)
	a.reg.Store(reg)
	for _, m := range oldReg.list {
		if reg.byName[m.Name()] == nil {
			m.Retire()
		}
	}
	a.retireRemotes(oldReg, reg)
	for _, m := range added {
		go m.Observe(a.ctx)
	}
	a.metrics.Reloads.WithLabelValues("ok").Inc()
	a.log.Info("config reloaded", "config", cfg.Path, "models", len(reg.list), "added", len(added))
	a.publishEvent(control.Event{Time: time.Now(), Kind: control.EventReload, Reason: fmt.Sprintf("%d models", len(reg.list))})
	a.notify.Kick()
	return nil
}

// gatewayModels is the Agent as the gateway sees it.
type gatewayModels Agent

func (g *gatewayModels) agent() *Agent { return (*Agent)(g) }

// Resolve implements gateway.Models.
func (g *gatewayModels) Resolve(name string) (string, bool) {
	return g.agent().reg.Load().resolveName(name)
}

// List implements gateway.Models.
func (g *gatewayModels) List() []gateway.ModelInfo {
	reg := g.agent().reg.Load()
	out := make([]gateway.ModelInfo, 0, len(reg.list))
	for _, m := range reg.list {
		s := m.Snapshot()
		info := gateway.ModelInfo{Name: m.Name(), Aliases: s.Config.Aliases, Unlisted: !s.Config.Listed, State: s.Lifecycle.State.String(), Reason: g.agent().desk.Measured().Reason(m.Name(), s.Lifecycle),
			Serving: s.Lifecycle.State.Serving()}
		if holders := g.agent().desk.WaitingFor(m.Name()); holders != "" {
			info.RoomWaiting, info.WaitingFor = s.QueueDepth, holders
		}
		if r, ok := g.agent().weights.Residency(m.Name()); ok {
			info.Weights, info.WeightsResident = r.Bytes, r.Resident
		}
		s.RouterInfo(&info)
		out = append(out, info)
	}
	for _, m := range reg.remotes {
		out = append(out, remoteInfo(m.Snapshot()))
	}
	return out
}

// Progress implements gateway.Progress for models with wake_progress:
// what a request waits for, for the comments of an early-committed stream;
// the load's progress once it is measured.
func (g *gatewayModels) Progress(model string) (gateway.ProgressNote, bool) {
	m, ok := g.agent().reg.Load().byName[model]
	if !ok || !m.Snapshot().Config.WakeProgress {
		return gateway.ProgressNote{}, false
	}
	if holders := g.agent().desk.WaitingFor(model); holders != "" {
		return gateway.ProgressNote{Label: model + " waits for GPU memory held by " + holders}, true
	}
	switch s := m.Snapshot(); {
	case s.Load != nil && (s.Load.HaveFraction || s.Load.HaveLeft):
		// Only a figure that says how far or how long: else the time waited.
		return gateway.ProgressNote{Label: s.Load.Text(model), Measured: true}, true
	case s.Lifecycle.State == lifecycle.Waking:
		return gateway.ProgressNote{Label: "waking " + model}, true
	}
	return gateway.ProgressNote{Label: "queued for " + model}, true
}

// Admit implements gateway.Models.
func (g *gatewayModels) Admit(ctx context.Context, a lease.Request) (*gateway.Ticket, error) {
	reg := g.agent().reg.Load()
	m, ok := reg.byName[a.Model]
	if r := reg.remoteName[a.Model]; r != nil {
		return r.Admit(ctx, a)
	}
	if !ok {
		return nil, &gateway.Refusal{Status: http.StatusNotFound, Code: "model_not_found",
			Message: fmt.Sprintf("model %q does not exist", a.Model)}
	}
	return m.Admit(ctx, a)
}

// QueueDepth implements gateway.Models.
func (g *gatewayModels) QueueDepth(model string) int {
	reg := g.agent().reg.Load()
	if m, ok := reg.byName[model]; ok {
		return m.QueueDepth()
	}
	if r := reg.remoteName[model]; r != nil {
		return r.QueueDepth()
	}
	return 0
}
