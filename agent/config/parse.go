package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/gateway/pathrule"
	"github.com/napd/napd/sleepmode"
	"github.com/napd/napd/supervisor"
)

// DefaultPath is where napd reads its configuration unless told otherwise.
const DefaultPath = "/etc/napd/napd.toml"

// Defaults for model keys that product.md leaves open.
const (
	DefaultHealth         = "/health"
	DefaultMaxConcurrency = 32
	DefaultQueue          = 128
	DefaultStopTimeout    = 30 * time.Second
	// DefaultMaxConnections stays far below the file limit napd.service
	// sets (LimitNOFILE=65536): each client connection may hold a second
	// descriptor to its engine, and napctl must still get one.
	DefaultMaxConnections = 4096
)

// deprecatedKeys are keys napd still accepts, for one release, and ignores:
// a file that sets one loads with a warning (Config.Warnings) saying what
// to do instead.
var deprecatedKeys = map[string]string{
	"agent.cpus": "deprecated and ignored: napd no longer sets GOMAXPROCS, Go sizes it from the CPUs napd may use " +
		"(its cgroup's CPU quota counted); remove the key, and if napd must use fewer threads set GOMAXPROCS in " +
		"napd.service's environment (systemctl edit napd: Environment=GOMAXPROCS=N)",
	"agent.heap_floor": "deprecated and ignored: napd no longer keeps a heap floor; remove the key, and if napd's " +
		"garbage collector must run less often set GOGC in napd.service's environment " +
		"(systemctl edit napd: Environment=GOGC=400)",
}

// Default returns the configuration of an empty file: every default, no
// models.
func Default() *Config {
	return &Config{
		Agent: Agent{
			Supervisor:    supervisor.KindAuto,
			StateDir:      "/var/lib/napd",
			ControlSocket: "/run/napd/control.sock",
			MetricsListen: "127.0.0.1:9464",
			LogLevel:      "info",
			IncludeDir:    DefaultIncludeDir,

			ContainerRuntime: RuntimeAuto,
		},
		Gateway: Gateway{
			Listen:           []string{"127.0.0.1:8080"},
			MaxBody:          16 << 20,
			RequestTimeout:   10 * time.Minute,
			Routes:           DefaultRoutes(),
			ListAliases:      true,
			CORSOrigins:      []string{},
			KeepaliveTimeout: 75 * time.Second,
			WriteTimeout:     60 * time.Second,
			MaxConnections:   DefaultMaxConnections,
		},
		Policy: Policy{
			IdleTimeout:          15 * time.Minute,
			DrainTimeout:         30 * time.Second,
			ArrivalWhileDraining: lifecycle.ArrivalCancelDrain,
			WakeAttempts:         3,
			WakeTimeout:          10 * time.Minute,
			HealthInterval:       10 * time.Second,
			HealthFailures:       3,
			YieldAfter:           30 * time.Second,
			FairShare:            FairShareAuto,
			DeepSleep:            sleepmode.None,
			DeepSleepAfter:       time.Hour,
			Priorities:           priority.DefaultClasses,
			PriorityAge:          time.Minute,
			PriorityYieldAfter:   map[string]time.Duration{},
			WarmWeights:          WarmWeightsAuto,
		},
		Pressure: Pressure{
			GPUReserve:   1 << 30,
			HostReserve:  2 << 30,
			PSISomeAvg10: 20,
		},
	}
}

// MaxFileSize bounds a config file: far above any real one, it makes
// `--config /dev/zero` or a runaway file an error instead of a hang.
const MaxFileSize = 4 << 20

// Parse validates data, the contents of the file path (used in messages),
// alone: drop-ins are read by Load. When data is not valid it returns
// Errors holding every problem found.
func Parse(path string, data []byte) (*Config, error) {
	d := newDecoder()
	d.readMain(path, data)
	return d.finish()
}

// decoder reads the main file and its drop-ins, then resolves the models.
// Every value is decoded on its own so that a wrong value does not stop the
// walk (all problems are reported at once) and so that its line is known.
type decoder struct {
	errs Errors
	// warnings are what a valid file is told: the deprecated keys it sets.
	warnings Errors
	order    map[string]int              // file -> its place in reading order, to sort problems
	getenv   func(string) (string, bool) // ${env:NAME}
	cfg      *Config                     // the main file's tables, decoded as read
	tables   map[string]*table           // the main file's top-level tables
	models   []*table                    // every file's [models.NAME], in reading order
	tmpls    map[string]*table           // every file's [templates.NAME]
	decls    []decl                      // the resolved models
}

func newDecoder() *decoder {
	return &decoder{
		order:  map[string]int{},
		getenv: os.LookupEnv,
		cfg:    Default(),
		tables: map[string]*table{},
		tmpls:  map[string]*table{},
	}
}

func (d *decoder) add(file string, line int, key toml.Key, msg string) {
	d.errs = append(d.errs, Problem{File: file, Line: line, Key: key.String(), Message: msg})
}

// addAt reports a problem with the value e.
func (d *decoder) addAt(e entry, msg string) { d.add(e.file, e.line, e.path, msg) }

// finish resolves the models of every file read and returns the
// configuration, or every problem found, sorted by file and line.
func (d *decoder) finish() (*Config, error) {
	d.resolveModels()
	if len(d.errs) > 0 {
		// A template's value checked for each model that takes it is
		// reported once.
		return nil, slices.Compact(d.inFileOrder(d.errs))
	}
	d.cfg.Warnings = d.inFileOrder(d.warnings)
	return d.cfg, nil
}

// inFileOrder sorts problems by file (in reading order), line and key; the
// keys of a table are walked in no order.
func (d *decoder) inFileOrder(ps Errors) Errors {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(d.order[a.File], d.order[b.File]), cmp.Compare(a.Line, b.Line), strings.Compare(a.Key, b.Key))
	})
	return ps
}

// locator fails every decode; the ParseError the toml package wraps around
// that failure carries the position of the key being decoded, which the
// package exposes no other way.
type locator struct{}

var errLocate = errors.New("locate")

// UnmarshalTOML implements toml.Unmarshaler.
func (locator) UnmarshalTOML(any) error { return errLocate }

// file is one TOML document being read.
type file struct {
	d    *decoder
	name string
	md   toml.MetaData
}

// line is the line of the value p was decoded from; for an implicit table
// ([a.b] without [a]), which has no line of its own, its first key's; 0
// when unknown.
func (f *file) line(p toml.Primitive) int {
	var pe toml.ParseError
	if errors.As(f.md.PrimitiveDecode(p, &locator{}), &pe) && pe.Position.Line > 0 {
		return pe.Position.Line
	}
	var keys map[string]toml.Primitive
	if f.md.PrimitiveDecode(p, &keys) != nil {
		return 0
	}
	first := 0
	for _, kp := range keys {
		if l := f.line(kp); l > 0 && (first == 0 || l < first) {
			first = l
		}
	}
	return first
}

// entry is one key's value as written: decoded, with where it was written.
type entry struct {
	raw  any
	file string
	line int
	path toml.Key // the key's full path where it was written
	tmpl string   // in a model: the template it came from, "" for its own
}

// table is one TOML table with its keys decoded but not yet checked.
type table struct {
	file  string
	path  toml.Key
	line  int
	keys  map[string]entry
	prims map[string]toml.Primitive // the keys undecoded, to open a table within
}

// at is the value of key name in t, or, when t has none, where it would be
// (t's own line).
func (t *table) at(name string) entry {
	if e, ok := t.keys[name]; ok {
		return e
	}
	return entry{file: t.file, line: t.line, path: child(t.path, name)}
}

func (t *table) has(name string) bool {
	_, ok := t.keys[name]
	return ok
}

func child(path toml.Key, name string) toml.Key {
	return append(slices.Clone(path), name)
}

// open decodes p as a table, or reports that it is not one.
func (f *file) open(path toml.Key, p toml.Primitive) (*table, bool) {
	line := f.line(p)
	var raw any
	if err := f.md.PrimitiveDecode(p, &raw); err != nil {
		f.d.add(f.name, line, path, err.Error())
		return nil, false
	}
	if _, ok := raw.(map[string]any); !ok {
		f.d.add(f.name, line, path, wantType("a table", raw).Error())
		return nil, false
	}
	var prims map[string]toml.Primitive
	if err := f.md.PrimitiveDecode(p, &prims); err != nil {
		f.d.add(f.name, line, path, err.Error())
		return nil, false
	}
	t := &table{file: f.name, path: path, line: line, keys: make(map[string]entry, len(prims)), prims: prims}
	for name, kp := range prims {
		e := entry{file: f.name, line: f.line(kp), path: child(path, name)}
		if err := f.md.PrimitiveDecode(kp, &e.raw); err != nil {
			f.d.addAt(e, err.Error())
			continue
		}
		t.keys[name] = e
	}
	return t, true
}

// fields decodes every key of t with its setter; keys without one are
// unknown.
func (d *decoder) fields(t *table, schema map[string]setter) {
	for name, e := range t.keys {
		if why, ok := deprecatedKeys[e.path.String()]; ok {
			d.warnings = append(d.warnings, Problem{File: e.file, Line: e.line, Key: e.path.String(), Message: why})
			continue
		}
		set, ok := schema[name]
		if !ok {
			d.addAt(e, unknownKey(name, schema))
			continue
		}
		if err := set.set(e.raw); err != nil {
			d.addAt(e, err.Error())
		}
	}
}

// unknownKey names a likely intended key when the difference is only case
// or '-' for '_'.
func unknownKey[V any](name string, known map[string]V) string {
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "-", "_")) }
	for k := range known {
		if norm(k) == norm(name) {
			return fmt.Sprintf("unknown key (did you mean %q?)", k)
		}
	}
	return "unknown key"
}

// read parses one file's TOML and returns its top-level tables.
func (d *decoder) read(name string, data []byte) (*file, map[string]toml.Primitive, bool) {
	if _, ok := d.order[name]; !ok {
		d.order[name] = len(d.order)
	}
	var top map[string]toml.Primitive
	md, err := toml.Decode(string(data), &top)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			d.errs = append(d.errs, Problem{File: name, Line: pe.Position.Line, Message: pe.Message})
		} else {
			d.errs = append(d.errs, Problem{File: name, Message: err.Error()})
		}
		return nil, nil, false
	}
	return &file{d: d, name: name, md: md}, top, true
}

// hostTables are the tables of the main file alone: they configure napd
// itself, not one model.
var hostTables = []string{"agent", "gateway", "policy", "pressure"}

// readMain reads the main configuration file.
func (d *decoder) readMain(name string, data []byte) {
	d.cfg.Path = name
	f, top, ok := d.read(name, data)
	if !ok {
		return
	}
	cfg := d.cfg
	schemas := map[string]map[string]setter{
		"agent":    agentSchema(&cfg.Agent),
		"gateway":  gatewaySchema(&cfg.Gateway),
		"policy":   policyTableSchema(&cfg.Policy),
		"pressure": pressureSchema(&cfg.Pressure),
	}
	known := map[string]bool{"models": true, "templates": true}
	for _, name := range hostTables {
		known[name] = true
	}
	for name, p := range top {
		if !known[name] {
			d.add(f.name, f.line(p), toml.Key{name}, unknownKey(name, known))
		}
	}
	for _, name := range hostTables {
		if p, ok := top[name]; ok {
			if t, ok := f.open(toml.Key{name}, p); ok {
				d.tables[name] = t
				d.fields(t, schemas[name])
			}
		}
	}
	d.collect(f, top)
}

// readDropIn reads one file of the include directory: models and templates
// only.
func (d *decoder) readDropIn(name string, data []byte) {
	f, top, ok := d.read(name, data)
	if !ok {
		return
	}
	for key, p := range top {
		switch {
		case key == "models" || key == "templates":
		case slices.Contains(hostTables, key):
			d.add(f.name, f.line(p), toml.Key{key}, fmt.Sprintf("[%s] belongs in the main file %s: a drop-in holds [models.*] and [templates.*] only", key, d.cfg.Path))
		default:
			d.add(f.name, f.line(p), toml.Key{key}, "unknown key: a drop-in holds [models.*] and [templates.*] only")
		}
	}
	d.collect(f, top)
}

// collect takes the models and templates of one file, in the file's order,
// and reports a name already defined by an earlier file.
func (d *decoder) collect(f *file, top map[string]toml.Primitive) {
	for _, kind := range []string{"models", "templates"} {
		p, ok := top[kind]
		if !ok {
			continue
		}
		t, ok := f.open(toml.Key{kind}, p)
		if !ok {
			continue
		}
		// File order; the map from the decoder has none.
		var names []string
		for _, k := range f.md.Keys() {
			if len(k) >= 2 && k[0] == kind && !slices.Contains(names, k[1]) {
				names = append(names, k[1])
			}
		}
		for _, name := range names {
			p, ok := t.prims[name]
			if !ok {
				continue
			}
			mt, ok := f.open(child(t.path, name), p)
			if err := validModelName(name); err != nil {
				d.add(f.name, f.line(p), child(t.path, name), strings.Replace(err.Error(), "model name", strings.TrimSuffix(kind, "s")+" name", 1))
			}
			if !ok {
				continue
			}
			if kind == "models" {
				if prev := d.modelTable(name); prev != nil {
					d.add(mt.file, mt.line, mt.path, fmt.Sprintf("model %s is already defined at %s:%d", name, prev.file, prev.line))
					continue
				}
				d.models = append(d.models, mt)
			} else {
				if prev := d.tmpls[name]; prev != nil {
					d.add(mt.file, mt.line, mt.path, fmt.Sprintf("template %s is already defined at %s:%d", name, prev.file, prev.line))
					continue
				}
				d.tmpls[name] = mt
			}
		}
	}
}

func (d *decoder) modelTable(name string) *table {
	for _, t := range d.models {
		if t.path[len(t.path)-1] == name {
			return t
		}
	}
	return nil
}

// checkListens reports two of napd's own listen addresses (gateway.listen,
// agent.metrics_listen, agent.haproxy_agent_listen, models.NAME.listen) that cannot both be bound:
// the same port on the same host, where "localhost" is 127.0.0.1 and ::1,
// and a wildcard host ("0.0.0.0", "::", "") takes the port on every
// address. Such a config would fail at start, so --check fails on it.
func (d *decoder) checkListens(cfg *Config) {
	type claim struct {
		addr, owner string
		at          entry
	}
	var claims []claim
	at := func(tbl, key string) entry {
		if t := d.tables[tbl]; t != nil {
			return t.at(key)
		}
		return entry{file: cfg.Path, path: toml.Key{tbl, key}}
	}
	for _, l := range cfg.Gateway.Listen {
		claims = append(claims, claim{l, "gateway.listen", at("gateway", "listen")})
	}
	for _, a := range []struct{ key, addr string }{
		{"metrics_listen", cfg.Agent.MetricsListen},
		{"haproxy_agent_listen", cfg.Agent.HAProxyAgentListen},
	} {
		if a.addr != "" {
			claims = append(claims, claim{a.addr, "agent." + a.key, at("agent", a.key)})
		}
	}
	for _, dc := range d.decls {
		if dc.m.Listen != "" {
			claims = append(claims, claim{dc.m.Listen, "models." + dc.m.Name + ".listen", dc.t.at("listen")})
		}
	}
	for i, c := range claims {
		for _, prev := range claims[:i] {
			if listensOverlap(prev.addr, c.addr) {
				d.addAt(c.at, fmt.Sprintf("%s collides with %s %s: both cannot listen", c.addr, prev.owner, prev.addr))
				break
			}
		}
	}
}

// listensOverlap reports whether two HOST:PORT listen addresses cannot
// both be bound. Port 0 (any free port) never collides.
func listensOverlap(a, b string) bool {
	ha, _, errA := net.SplitHostPort(a)
	hb, _, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || addrPort(a) == 0 || addrPort(a) != addrPort(b) {
		return false
	}
	hostsA, hostsB := listenHosts(ha), listenHosts(hb)
	if hostsA == nil || hostsB == nil {
		return true // a wildcard: every address
	}
	for _, x := range hostsA {
		if slices.Contains(hostsB, x) {
			return true
		}
	}
	return false
}

// listenHosts are the addresses a listen host stands for; nil for a
// wildcard.
func listenHosts(h string) []string {
	switch strings.ToLower(h) {
	case "", "0.0.0.0", "::":
		return nil
	case "localhost":
		return []string{"127.0.0.1", "::1"}
	}
	if ip := net.ParseIP(h); ip != nil {
		return []string{ip.String()}
	}
	return []string{strings.ToLower(h)}
}

func agentSchema(a *Agent) map[string]setter {
	return map[string]setter{
		"supervisor":           setEnum(&a.Supervisor, supervisor.KindAuto, supervisor.KindSystemd, supervisor.KindExec),
		"state_dir":            setString(&a.StateDir, absPath),
		"control_socket":       setString(&a.ControlSocket, socketPath),
		"metrics_listen":       setString(&a.MetricsListen, optional(hostPort)),
		"events_address":       setString(&a.EventsAddress, optional(zmqAddress)),
		"haproxy_agent_listen": setString(&a.HAProxyAgentListen, optional(hostPort)),
		"log_level":            setEnum(&a.LogLevel, "debug", "info", "warn", "error"),
		"include_dir":          setString(&a.IncludeDir, commandArg),

		"container_runtime": setEnum(&a.ContainerRuntime, RuntimeAuto, RuntimePodman, RuntimeDocker),
	}
}

func gatewaySchema(g *Gateway) map[string]setter {
	return map[string]setter{
		"listen":            setStrings(&g.Listen, hostPort),
		"max_body":          setSize(&g.MaxBody, false),
		"request_timeout":   setDuration(&g.RequestTimeout, false),
		"api_keys_file":     setString(&g.APIKeysFile, optional(absPath)),
		"routes":            setRoutes(&g.Routes),
		"list_aliases":      setBool(&g.ListAliases),
		"cors_origins":      setStrings(&g.CORSOrigins, corsOrigin),
		"keepalive_timeout": setDuration(&g.KeepaliveTimeout, true),
		"write_timeout":     setDuration(&g.WriteTimeout, false),
		"max_connections":   setInt(&g.MaxConnections, 1, 1<<20),
		"upstream_deny":     setStrings(&g.UpstreamDeny, pathrule.Check),
		"upstream_allow":    setStrings(&g.UpstreamAllow, pathrule.Check),
	}
}

func policySchema(p *Policy) map[string]setter {
	return map[string]setter{
		"idle_timeout":           setDuration(&p.IdleTimeout, true),
		"drain_timeout":          setDuration(&p.DrainTimeout, false),
		"arrival_while_draining": setEnum(&p.ArrivalWhileDraining, lifecycle.ArrivalCancelDrain, lifecycle.ArrivalRefuse),
		"wake_attempts":          setInt(&p.WakeAttempts, 1, 100),
		"wake_timeout":           setDuration(&p.WakeTimeout, false),
		"wake_stall_timeout":     setDuration(&p.WakeStallTimeout, true),
		"allow_untracked_unload": setBool(&p.AllowUntrackedUnload),
		"health_interval":        setDuration(&p.HealthInterval, true),
		"health_failures":        setInt(&p.HealthFailures, 1, 100),
		"yield_after":            setDuration(&p.YieldAfter, true),
		"deep_sleep":             setEnum(&p.DeepSleep, sleepmode.Stop, sleepmode.None),
		"deep_sleep_after":       setDuration(&p.DeepSleepAfter, true),
		"fair_share":             setEnum(&p.FairShare, FairShareAuto, FairShareOn, FairShareOff),
	}
}

// policyTableSchema is [policy]'s keys: the ones models inherit, and the
// ones only the host has.
func policyTableSchema(p *Policy) map[string]setter {
	schema := policySchema(p)
	schema["max_awake"] = setInt(&p.MaxAwake, 0, 1<<20)
	schema["priorities"] = setClasses(&p.Priorities)
	schema["priority_age"] = setDuration(&p.PriorityAge, false)
	schema["priority_yield_after"] = setDurations(&p.PriorityYieldAfter)
	schema["warm_weights"] = setWarmWeights(&p.WarmWeights)
	return schema
}

func pressureSchema(p *Pressure) map[string]setter {
	return map[string]setter{
		"gpu_reserve":    setSize(&p.GPUReserve, true),
		"host_reserve":   setSize(&p.HostReserve, true),
		"psi_some_avg10": setFloat(&p.PSISomeAvg10, 0, 100),
	}
}

// modelSchema decodes a model's own keys into m and its [policy] keys into
// pol, which starts as a copy of [policy].
func modelSchema(m *Model, pol *Policy) map[string]setter {
	schema := policySchema(pol)
	maps.Copy(schema, map[string]setter{
		"command":           setCommand(&m.Command),
		"unit":              setString(&m.Unit, unitName),
		"port":              setInt(&m.Port, 0, 65535),
		"aliases":           setStrings(&m.Aliases, aliasName),
		"health":            setString(&m.Health, healthPath),
		"sleep":             setEnum(&m.Sleep, sleepmode.Stop, sleepmode.VLLML1, sleepmode.VLLML2, sleepmode.SGLang, sleepmode.LlamaCpp, sleepmode.None),
		"gpus":              setGPUs(&m.GPUs, &m.GPUCount),
		"gpu_memory":        setSize(&m.GPUMemory, false),
		"max_concurrency":   setInt(&m.MaxConcurrency, 1, 1<<20),
		"queue":             setInt(&m.Queue, 0, 1<<20),
		"pinned":            setBool(&m.Pinned),
		"environment":       setEnvironment(&m.Environment),
		"listen":            setString(&m.Listen, optional(hostPort)),
		"served_name":       setString(&m.ServedName, servedName),
		"transport":         setEnum(&m.Transport, TransportHTTP, TransportZMQ),
		"address":           setString(&m.Address, zmqAddress),
		"working_directory": setString(&m.WorkingDirectory, absPath),
		"user":              setString(&m.User, userName),
		"stop_timeout":      setDuration(&m.StopTimeout, false),
		"evidence":          setEnum(&m.Evidence, EvidenceAuto, EvidenceConnections, EvidenceMetrics, EvidenceLeases),
		"activity_metrics":  setStrings(&m.ActivityMetrics, metricName),
		"wake_progress":     setBool(&m.WakeProgress),
		"listed":            setBool(&m.Listed),
		"warm_on_start":     setBool(&m.WarmOnStart),
		"keep_awake":        setWindows(&m.KeepAwake),
		"weights":           setStrings(&m.Weights, nil),
		"priority":          setClass(&m.Priority, &pol.Priorities),
		"engine_priority":   setBool(&m.EnginePriority),
	})
	maps.Copy(schema, containerSchema(m))
	maps.Copy(schema, remoteSchema(m))
	return schema
}

// newModel is a model with every default.
func newModel(name string) *Model {
	return &Model{
		Name:           name,
		Health:         DefaultHealth,
		Sleep:          sleepmode.Stop,
		Transport:      TransportHTTP,
		MaxConcurrency: DefaultMaxConcurrency,
		Queue:          DefaultQueue,
		StopTimeout:    DefaultStopTimeout,
		Evidence:       EvidenceAuto,
		APIKeyHeader:   DefaultAPIKeyHeader,
		OverflowWhen:   OverflowLate,
		Listed:         true,
	}
}

// setPolicy makes p the model's effective policy.
func (m *Model) setPolicy(p Policy) {
	m.IdleTimeout = p.IdleTimeout
	m.DrainTimeout = p.DrainTimeout
	m.ArrivalWhileDraining = p.ArrivalWhileDraining
	m.WakeAttempts = p.WakeAttempts
	m.WakeTimeout = p.WakeTimeout
	m.WakeStallTimeout = p.WakeStallTimeout
	m.AllowUntrackedUnload = p.AllowUntrackedUnload
	m.HealthInterval = p.HealthInterval
	m.HealthFailures = p.HealthFailures
	m.YieldAfter = p.YieldAfter
	m.DeepSleep = p.DeepSleep
	m.DeepSleepAfter = p.DeepSleepAfter
}

// decl is a decoded model with the table it came from, for checks that
// span models.
type decl struct {
	m *Model
	t *table
}

// resolveModels decodes every model of every file read, with its
// templates and substitutions, and checks them against each other.
func (d *decoder) resolveModels() {
	cfg := d.cfg
	for _, name := range hostTables {
		t := d.tables[name]
		if t == nil {
			t = &table{file: cfg.Path, path: toml.Key{name}}
		}
		d.record(t, hostSchema(cfg, name), nil)
	}
	d.checkPriorities()
	d.checkTemplates()
	for _, own := range d.models {
		name := own.path[len(own.path)-1]
		mt, tmpls, vars := d.withTemplates(own)
		m, pol := newModel(name), cfg.Policy
		m.Priority = cfg.Policy.Priorities.Default()
		schema := modelSchema(m, &pol)
		d.substitute(mt, name, vars)
		d.fields(mt, withMeta(schema))
		m.setPolicy(pol)
		// A url that did not decode is reported already: the model is
		// still remote, and the keys of a local one are not asked for.
		remote := mt.has("url")
		d.checkRemote(m, mt, schema)
		if !remote {
			d.checkContainer(m, mt, cfg.Agent)
		}
		// [gateway] is decoded before the models.
		m.FairShare = pol.FairShare == FairShareOn || (pol.FairShare == FairShareAuto && cfg.Gateway.APIKeysFile != "")
		m.PriorityAge = cfg.Policy.PriorityAge
		if !remote {
			d.checkModel(m, mt)
		}
		d.decls = append(d.decls, decl{m, mt})
		d.record(mt, schema, tmpls)
	}
	d.checkUnique(d.decls, cfg)
	d.checkOverflow(d.decls)
	for _, dc := range d.decls {
		cfg.Models = append(cfg.Models, dc.m)
	}
	d.checkListens(cfg)
}

// hostSchema is the schema of the host table name, decoding into cfg.
func hostSchema(cfg *Config, name string) map[string]setter {
	switch name {
	case "agent":
		return agentSchema(&cfg.Agent)
	case "gateway":
		return gatewaySchema(&cfg.Gateway)
	case "policy":
		return policyTableSchema(&cfg.Policy)
	}
	return pressureSchema(&cfg.Pressure)
}

// checkModel checks the keys of one model against each other.
func (d *decoder) checkModel(m *Model, t *table) {
	hasCmd, hasUnit, hasAddr := t.has("command"), t.has("unit"), t.has("address")
	switch {
	case hasCmd && hasUnit:
		d.addAt(t.at("unit"), "command and unit are both set: set exactly one")
	case !hasCmd && !hasUnit && m.Image == "":
		d.add(t.file, t.line, t.path, "neither command nor unit is set: set command (napd runs the engine), image (napd runs it in a container) or unit (an operator-managed unit)")
	}
	switch m.Transport {
	case TransportZMQ:
		if !hasAddr {
			d.add(t.file, t.line, t.path, `transport = "zmq" needs address`)
		}
		if m.Evidence != EvidenceAuto {
			d.addAt(t.at("evidence"), `a transport = "zmq" worker reports its own activity: leave evidence at "auto"`)
		}
		// The vLLM and SGLang strategies call HTTP endpoints a ZMQ worker has not.
		if m.Sleep != sleepmode.Stop && m.Sleep != sleepmode.None {
			d.addAt(t.at("sleep"), fmt.Sprintf(`sleep = %q needs an HTTP engine: a transport = "zmq" worker sleeps by "stop" or "none"`, m.Sleep))
		}
	case TransportHTTP:
		if hasAddr {
			d.addAt(t.at("address"), `only used with transport = "zmq"`)
		}
		if m.Port == 0 && m.Unit != "" && !hasCmd {
			at := t.at("unit")
			at.path = child(t.path, "port")
			d.addAt(at, "an operator-managed unit listens on a port of its own: set port")
		}
		runs := len(m.Command) > 0 || (!hasCmd && m.Image != "") // a command that did not decode is reported already
		if m.Port == 0 && !hasUnit && runs && m.ContainerPort == 0 && !m.mentions(varPort) {
			k := "command"
			if !hasCmd {
				k = "image"
			}
			d.addAt(t.at(k), "port = 0 lets napd pick the port: pass ${PORT} in command or environment so the engine listens on it (or publish the container's own port with container_port)")
		}
	}
	if m.GPUCount > 0 && hasUnit {
		d.addAt(t.at("gpus"), "napd cannot choose the GPUs of an operator-managed unit: list them (gpus = [0]) or use command")
	}
	if len(m.GPUs) == 0 && m.GPUCount == 0 && m.mentions(varGPUs) {
		at := t.at("command")
		if !slices.ContainsFunc(m.Command, func(s string) bool { return mentions(s, varGPUs) }) {
			at = t.at("environment")
		}
		d.addAt(at, "${GPUS} is the GPUs napd gives the engine, and gpus is not set: set gpus (a list, \"any\" or { count = N })")
	}
	if t.has("activity_metrics") && m.Evidence != EvidenceAuto && m.Evidence != EvidenceMetrics {
		d.addAt(t.at("activity_metrics"), fmt.Sprintf(`only used with evidence = "auto" or "metrics", not %q`, m.Evidence))
	}
	d.checkSelfSleep(m, t)
	d.checkWeights(m, t)
}

// addrPort is the port of a HOST:PORT address, 0 when it has none.
func addrPort(addr string) int {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}

// checkUnique reports names, aliases, ports and listen addresses that two
// models (or a model and the gateway) claim. A model's port must not be a
// port napd itself listens on (the gateway, the metrics, the HAProxy agent
// check, a model's own socket): the engine could not bind it, or napd would
// forward to itself.
func (d *decoder) checkUnique(decls []decl, cfg *Config) {
	isModel := map[string]bool{}
	for _, dc := range decls {
		isModel[dc.m.Name] = true
	}
	type owner struct {
		model string
		at    entry
	}
	aliasOwner := map[string]owner{}
	portOwner := map[int]string{}
	listenPort := map[int]string{} // napd's own listen ports, for the engines' ports
	addListen := func(addr, owner string) {
		if p := addrPort(addr); p != 0 {
			if _, dup := listenPort[p]; !dup {
				listenPort[p] = owner + " (" + addr + ")"
			}
		}
	}
	for _, l := range cfg.Gateway.Listen {
		addListen(l, "gateway.listen")
	}
	addListen(cfg.Agent.MetricsListen, "agent.metrics_listen")
	addListen(cfg.Agent.HAProxyAgentListen, "agent.haproxy_agent_listen")
	for _, dc := range decls {
		if dc.m.Listen != "" {
			addListen(dc.m.Listen, "the listen of model "+dc.m.Name)
		}
	}
	for _, dc := range decls {
		m := dc.m
		for _, a := range m.Aliases {
			at := dc.t.at("aliases")
			switch prev, dup := aliasOwner[a]; {
			case isModel[a]:
				d.addAt(at, fmt.Sprintf("alias %q is the name of model %s", a, a))
			case dup && prev.model == m.Name:
				d.addAt(at, fmt.Sprintf("alias %q is listed twice", a))
			case dup:
				d.addAt(at, fmt.Sprintf("alias %q is already an alias of model %s (%s:%d)", a, prev.model, prev.at.file, prev.at.line))
			default:
				aliasOwner[a] = owner{m.Name, at}
			}
		}
		if m.Port != 0 && m.Transport == TransportHTTP {
			at := dc.t.at("port")
			if owner, dup := portOwner[m.Port]; dup {
				d.addAt(at, fmt.Sprintf("port %d is already used by model %s", m.Port, owner))
			} else {
				portOwner[m.Port] = m.Name
			}
			if owner, ok := listenPort[m.Port]; ok {
				d.addAt(at, fmt.Sprintf("port %d is napd's own: %s listens on it", m.Port, owner))
			}
		}
	}
}

// checkPriorities checks that [policy] priority_yield_after names classes
// of [policy] priorities (the keys of a table are decoded in no order, so
// not before both are).
func (d *decoder) checkPriorities() {
	pol := d.cfg.Policy
	for _, name := range slices.Sorted(maps.Keys(pol.PriorityYieldAfter)) {
		if _, err := pol.Priorities.Parse(name); err != nil {
			d.addAt(d.tables["policy"].at("priority_yield_after"), err.Error())
		}
	}
}
