// Package agent is napd's daemon: it loads the config, picks the supervisor
// backend, reconciles the engines it finds, runs one owner loop per model
// around the lifecycle machine, serves the gateway, the control socket and
// the metrics, plans sleeps under idleness and memory pressure, reloads on
// SIGHUP and shuts down on SIGTERM without dropping accepted requests.
//
// It owns the registry of models (replaced whole on reload), the gateway and
// control servers and the wiring of the parts: the model loops
// (agent/model), the make-room desk that performs the planner's decisions
// (agent/room), the probes' rounds (agent/measure), sd_notify
// (agent/notify) and the agent check (agent/fleet). It must not touch a
// model's state but through agent/model's methods, decide what the
// lifecycle or the planner decide, or reach past supervisor.Supervisor to a
// backend (it links none: cmd/napd hands it supervisor/backend.Open).
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/logging"
	"github.com/napd/napd/agent/measure"
	"github.com/napd/napd/agent/memo"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/agent/notify"
	"github.com/napd/napd/agent/room"
	"github.com/napd/napd/agent/servers"
	"github.com/napd/napd/agent/statuspage"
	"github.com/napd/napd/agent/usage"
	"github.com/napd/napd/agent/warmweights"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/internal/statefile"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/gpu"
	"github.com/napd/napd/probes/host"
	"github.com/napd/napd/probes/pagecache"
	"github.com/napd/napd/supervisor"
)

// Options configure a run of the daemon.
type Options struct {
	ConfigPath string
	Version    string
	Stderr     io.Writer
	// ShutdownGrace is how long in-flight requests may take to finish after
	// SIGTERM (default 30s).
	ShutdownGrace time.Duration
	// OpenBackend opens the engine supervisor's backend agent.supervisor
	// names (supervisor/backend.Open in napd): the agent links no concrete
	// backend.
	OpenBackend func(ctx context.Context, kind supervisor.Kind, o supervisor.OpenOptions) (supervisor.Backend, error)
}

// tickEvery is how often each model's deadlines are checked; planEvery how
// often the planner measures and decides.
const (
	tickEvery = time.Second
	planEvery = 2 * time.Second
)

// Agent is a running napd.
type Agent struct {
	opts  Options
	log   *slog.Logger
	level *slog.LevelVar
	ctx   context.Context // cancelled when napd stops
	// ctrlCtx is cancelled when napd starts stopping: control and admin
	// requests (event followers never end on their own) end then, so they
	// do not hold the shutdown for its grace period.
	ctrlCtx    context.Context
	endControl context.CancelFunc
	clock      func() time.Time
	started    time.Time
	// stopping turns every agent check answer to drain (tellBalancers).
	stopping atomic.Bool

	cfg     atomic.Pointer[config.Config]
	reg     atomic.Pointer[registry]
	regMu   sync.Mutex // serialises reloads (writers of reg)
	handler atomic.Pointer[http.Handler]
	gw      atomic.Pointer[gateway.Gateway]

	tracker *lease.Tracker
	sup     *supervisor.Supervisor
	prober  *measure.Prober
	desk    *room.Desk // the make-room desk and the planner's rounds
	weights *warmweights.Keeper
	ports   *memo.Store   // ports napd allocated for port = 0 models
	usage   *usage.Ledger // GPU time and more per key (usage.json)
	metrics *metrics.Metrics
	hub     *control.Hub
	notify  *notify.Notifier
	loops   sync.WaitGroup // model owner loops
	helpers sync.WaitGroup // ticker, desk, status, engine events
	// The bound on the router API's event streams (every gateway's,
	// across reloads).
	streams *gateway.StreamLimit
}

// Run runs napd until ctx is cancelled (SIGTERM/SIGINT in cmd/napd). It
// returns an error when the daemon cannot start.
func Run(ctx context.Context, opts Options) error {
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 30 * time.Second
	}
	if opts.OpenBackend == nil {
		return errors.New("agent: no OpenBackend: the engine supervisor cannot start")
	}
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return err
	}
	if err := Check(cfg); err != nil {
		return err
	}
	lvl, err := logging.ParseLevel(cfg.Agent.LogLevel)
	if err != nil {
		return err
	}
	log, lv := logging.New(opts.Stderr, lvl)
	slog.SetDefault(log)

	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := &Agent{
		opts: opts, log: log, level: lv, ctx: runCtx, clock: time.Now, started: time.Now(),
		tracker: lease.NewTracker(lease.Options{}),
		hub:     control.NewHub(),
		notify:  notify.New(log),
		streams: gateway.NewStreamLimit(0, 0),
	}
	a.ctrlCtx, a.endControl = context.WithCancel(runCtx)
	a.cfg.Store(cfg)
	a.metrics = metrics.New(a.metricsSnapshot)
	log.Info("napd starting", "version", opts.Version, "config", cfg.Path, "models", len(cfg.Models))
	warnConfig(log, cfg)

	if err := statefile.Dir(cfg.Agent.StateDir, 0o750); err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	memos := make(map[string]*memo.Store) // learned GPU footprints, ports napd allocated, GPU sets chosen
	for _, name := range []string{"footprints", "ports", "placements"} {
		if memos[name], err = memo.Open(filepath.Join(cfg.Agent.StateDir, name+".json")); err != nil {
			return err
		}
	}
	a.ports = memos["ports"]
	// A usage.json that cannot be read is moved aside: napd starts with
	// empty figures rather than not at all.
	if a.usage, err = usage.Open(filepath.Join(cfg.Agent.StateDir, "usage.json"), nil); err != nil {
		log.Error("usage figures", "err", err)
	}
	backend, err := opts.OpenBackend(runCtx, cfg.Agent.Supervisor, supervisor.OpenOptions{
		StateDir: cfg.Agent.StateDir, Logger: log, ContainerRuntimes: cfg.ContainerRuntimes()})
	if err != nil {
		return err
	}
	a.sup = supervisor.New(backend, supervisor.Options{Logger: log, Ports: foreignListeners})
	gpus, closeGPU := gpu.Open(runCtx, log)
	defer closeGPU()
	a.prober = &measure.Prober{Host: &host.Reader{}, GPU: gpus, Supervisor: a.sup, Clock: a.clock, Log: log,
		Scraper: &enginemetrics.Scraper{Client: &http.Client{Timeout: time.Second}}}
	a.desk = room.New(room.Deps{
		Models: func() []room.Model {
			if reg := a.reg.Load(); reg != nil {
				return reg.desk
			}
			return nil
		},
		Config:     a.cfg.Load,
		Measure:    a.prober.Measure,
		Leases:     func(name string) lease.Evidence { ev, _ := a.tracker.Evidence(name); return ev },
		Footprints: memos["footprints"], Placements: memos["placements"],
		Metrics: a.metrics, Emit: a.hub.Publish, Clock: a.clock, After: time.After, Log: log,
		Expect: func(name string, by time.Time) {
			if m := a.reg.Load().byName[name]; m != nil {
				m.RoomExpected(by)
			}
		},
	})

	a.weights = warmweights.New(warmweights.Deps{Models: a.snapshots, Config: a.cfg.Load, Host: a.prober.Host,
		Cache: pagecache.Cache{Rate: warmweights.Rate}, Clock: a.clock, Log: log})

	plan, err := a.planRegistry(cfg, nil)
	if err != nil {
		return err
	}
	reg := a.applyRegistry(plan, nil)
	a.reg.Store(reg)
	a.reconcile(runCtx, reg.list)

	if cfg.Agent.EventsAddress != "" {
		if err := a.startEventPublisher(runCtx, cfg.Agent.EventsAddress); err != nil {
			return err
		}
	}
	// SIGHUP is taken before the gateway answers: a reload asked as soon as
	// napd serves (its /health) must not meet Go's default, which exits.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv, err := a.serve(cfg)
	if err != nil {
		return err
	}
	a.helpers.Add(5)
	go a.pumpEngineEvents()
	go a.ticker(runCtx)
	go func() { defer a.helpers.Done(); a.desk.Run(runCtx) }()
	go func() { defer a.helpers.Done(); a.weights.Run(runCtx) }()
	go func() { defer a.helpers.Done(); a.notify.Status(runCtx, a.statusLine) }()
	a.desk.WarmOnStart(runCtx)
	go a.notify.Watchdog(runCtx, a.healthy)

	a.notify.Ready()
	a.notify.Kick()
	log.Info("napd ready", "supervisor", a.sup.Name())
	for {
		select {
		case <-hup:
			if err := a.Reload(); err != nil {
				log.Error("reload refused; the running config stays", "err", err)
			}
		case <-ctx.Done():
			a.notify.Stopping()
			log.Info("napd stopping", "grace", opts.ShutdownGrace)
			a.tellBalancers(srv, opts.ShutdownGrace)
			srv.Shutdown(opts.ShutdownGrace)
			cancel()
			a.stopModels()
			a.saveUsage()
			a.closeSupervisor()
			a.helpers.Wait()
			log.Info("napd stopped")
			return nil
		}
	}
}

// closeSupervisor closes the backend: exec engines are stopped (no orphans);
// systemd units keep running and are adopted on the next start.
func (a *Agent) closeSupervisor() {
	if err := a.sup.Close(); err != nil {
		a.log.Warn("closing supervisor", "err", err)
	}
}

// stopModels ends every model loop (each closes its engine links).
func (a *Agent) stopModels() {
	reg := a.reg.Load()
	for _, m := range reg.list {
		m.Shutdown()
	}
	for _, m := range reg.remotes {
		m.Close()
	}
	a.loops.Wait()
}

// reconcile asks the supervisor what each engine is doing and tells the
// models; engines of models no longer configured that the backend finds
// (systemd units outlive napd) are stopped.
func (a *Agent) reconcile(ctx context.Context, models []*model.Model) {
	var wg sync.WaitGroup
	keep := make([]string, 0, len(models))
	for _, m := range models {
		keep = append(keep, m.Name())
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.Observe(ctx)
		}()
	}
	wg.Wait()
	stopped, err := a.sup.StopUnknown(ctx, keep)
	if err != nil {
		a.log.Warn("stopping engine units of removed models", "err", err)
	}
	for _, name := range stopped {
		a.log.Info("stopped engine unit of a model no longer configured", "model", name)
	}
}

// serve builds the gateway, opens the listeners and starts the HTTP
// servers. Every request's context is the agent's, so a shutdown reaches
// them all.
func (a *Agent) serve(cfg *config.Config) (*servers.Servers, error) {
	gw, err := a.newGateway(cfg)
	if err != nil {
		return nil, err
	}
	a.setGateway(gw)
	h := servers.Handlers{
		Gateway: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			(*a.handler.Load()).ServeHTTP(w, r)
		}),
		Model: func(name string) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				a.modelHandler(name).ServeHTTP(w, r)
			})
		},
		Control:    control.Handler(a, a.log),
		AgentCheck: a.startAgentCheck,
	}
	if cfg.Agent.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", a.metrics.Handler())
		engines := &enginemetrics.Scraper{Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: servers.MetricsIdle}}}
		mux.Handle(metrics.EnginesPath, metrics.EnginesHandler(a.engineTargets, engines.Families, a.log.With("listener", "metrics")))
		h.Metrics = mux
	}
	return servers.Start(cfg, h, servers.Contexts{Requests: a.ctx, Control: a.ctrlCtx, End: a.endControl}, a.log)
}

// engineTargets are the engines /metrics/engines reads: those of the
// models that serve (or drain) now; a sleeping model's is never asked.
func (a *Agent) engineTargets() []metrics.EngineTarget {
	list := a.reg.Load().list
	out := make([]metrics.EngineTarget, 0, len(list))
	for _, m := range list {
		s := m.Snapshot()
		t := metrics.EngineTarget{Model: m.Name()}
		if st := s.Lifecycle.State; s.Config.Transport == config.TransportHTTP && (st.Serving() || st == lifecycle.Draining) {
			t.URL = s.Spec.BaseURL()
		}
		out = append(out, t)
	}
	return out
}

// newGateway builds the gateway for cfg (its API keys read) without
// touching the running one.
func (a *Agent) newGateway(cfg *config.Config) (*gateway.Gateway, error) {
	var keys *gateway.APIKeys
	if cfg.Gateway.APIKeysFile != "" {
		var err error
		if keys, err = gateway.LoadAPIKeys(cfg.Gateway.APIKeysFile, cfg.Policy.Priorities); err != nil {
			return nil, err
		}
	}
	if prev := a.gw.Load(); prev != nil && keys != nil {
		// A key's requests in flight still count against its limit.
		keys.Inherit(prev.APIKeys())
	}
	return gateway.New(gateway.Options{
		MaxBody:        cfg.Gateway.MaxBody,
		RequestTimeout: cfg.Gateway.RequestTimeout,
		WriteTimeout:   cfg.Gateway.WriteTimeout,
		UpstreamDeny:   cfg.Gateway.UpstreamDeny,
		UpstreamAllow:  cfg.Gateway.UpstreamAllow,
		APIKeys:        keys,
		Routes:         gatewayRoutes(cfg.Gateway.Routes),
		ListAliases:    cfg.Gateway.ListAliases,
		CORSOrigins:    cfg.Gateway.CORSOrigins,
		Priorities:     cfg.Policy.Priorities,
		Quotas:         quotas{a.usage},
		Logger:         a.log,
		Observe:        a.observe,
		Admin:          a.adminHandler(),
		Streams:        a.streams,
		Stopping:       a.ctrlCtx.Done(),
	}, (*gatewayModels)(a)), nil
}

// setGateway swaps gw in; requests already running keep the one they
// started with.
func (a *Agent) setGateway(gw *gateway.Gateway) {
	// The metrics forget removed keys first: once a removed key is refused,
	// its series are gone.
	var clients []string
	if keys := gw.APIKeys(); keys != nil {
		clients = keys.Names()
	}
	a.metrics.SetClients(clients)
	h := gw.Handler()
	a.handler.Store(&h)
	a.gw.Store(gw)
}

func gatewayRoutes(rs []config.Route) []gateway.Route {
	out := make([]gateway.Route, len(rs))
	for i, r := range rs {
		out[i] = gateway.Route{Method: r.Method, Path: r.Path}
	}
	return out
}

// adminHandler serves /napd/ on the gateway (which authorises): the
// control API's status, wake, sleep, reset and events, and the status page.
// Its requests end when napd starts stopping, as control requests do.
func (a *Agent) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(control.AdminPrefix+"/v1/", control.AdminHandler(a, a.log))
	mux.Handle("GET "+gateway.AdminPath+"{$}", statuspage.Handler(a.Status, a.clock, a.log))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(a.ctrlCtx, cancel)()
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

// modelHandler is the handler of a model's dedicated socket.
func (a *Agent) modelHandler(model string) http.Handler {
	return a.gw.Load().ModelHandler(model)
}

// ticker drives deadlines and the planner.
func (a *Agent) ticker(ctx context.Context) {
	defer a.helpers.Done()
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	lastPlan, lastSave := time.Time{}, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			reg := a.reg.Load()
			for _, m := range reg.list {
				m.Tick()
			}
			for _, m := range reg.remotes {
				m.Tick() // its health check, when due
			}
			if now.Sub(lastPlan) >= planEvery {
				lastPlan = now
				a.desk.Plan(ctx)
				a.meterUsage(a.clock())
			}
			if now.Sub(lastSave) >= usageSaveEvery {
				lastSave = now
				a.saveUsage()
			}
		}
	}
}

// pumpEngineEvents turns engine exits napd did not ask for into lifecycle
// events of their models.
func (a *Agent) pumpEngineEvents() {
	defer a.helpers.Done()
	for ev := range a.sup.Events() {
		m := a.reg.Load().byName[ev.Model]
		if m == nil {
			continue
		}
		if ev.State == supervisor.ProcFailed || ev.State == supervisor.ProcStopped {
			m.EngineExited(ev.Reason, ev.Time)
		}
	}
}

// healthy is the watchdog's check: every model's owner loop answers. A
// wedged loop stops the pings, and systemd restarts napd.
func (a *Agent) healthy() error {
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	defer cancel()
	for _, m := range a.reg.Load().list {
		if err := m.Ping(ctx); err != nil {
			return fmt.Errorf("model %s: owner loop does not answer", m.Name())
		}
	}
	return nil
}

// statusChanged is told of every model state change: the STATUS= line,
// the make-room desk (memory may be coming back) and the weights keeper
// (an engine stopped, or a wake starts).
func (a *Agent) statusChanged() {
	a.notify.Kick()
	a.desk.Poke()
	a.weights.Poke()
}

// snapshots are the local models' snapshots now.
func (a *Agent) snapshots() []model.Snapshot {
	reg := a.reg.Load()
	if reg == nil {
		return nil
	}
	out := make([]model.Snapshot, len(reg.list))
	for i, m := range reg.list {
		out[i] = m.Snapshot()
	}
	return out
}

// statusLine is systemd's STATUS= line now.
func (a *Agent) statusLine() string {
	states := make(map[lifecycle.State]int)
	reg := a.reg.Load()
	for _, m := range reg.list {
		states[m.Snapshot().Lifecycle.State]++
	}
	for _, m := range reg.remotes {
		states[m.Snapshot().State]++
	}
	return notify.Line(states, len(reg.list)+len(reg.remotes), a.tracker.Stats().Live)
}

// warnConfig logs what is wrong with cfg but does not stop napd: the
// deprecated keys it sets, each with what to do instead.
func warnConfig(log *slog.Logger, cfg *config.Config) {
	for _, w := range cfg.Warnings {
		log.Warn("config key ignored", "file", w.File, "line", w.Line, "key", w.Key, "why", w.Message)
	}
}

func (a *Agent) publishEvent(e control.Event) {
	a.hub.Publish(e)
}
