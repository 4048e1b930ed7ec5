package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway/pathrule"
	"github.com/napd/napd/internal/statefile"
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

// Load reads and validates the configuration file at path, which must be a
// regular file of at most MaxFileSize bytes.
func Load(path string) (*Config, error) {
	data, err := statefile.ReadRegular(path, MaxFileSize)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse validates data, the contents of the file path (used in messages).
// When data is not valid it returns Errors holding every problem found.
func Parse(path string, data []byte) (*Config, error) {
	d := &decoder{file: path}
	cfg := d.decode(data)
	if len(d.errs) > 0 {
		return nil, inFileOrder(d.errs)
	}
	cfg.Path = path
	cfg.Warnings = inFileOrder(d.warnings)
	return cfg, nil
}

// inFileOrder sorts problems by line; stable, so the problems of one key
// keep the order they were found in.
func inFileOrder(ps Errors) Errors {
	slices.SortStableFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), strings.Compare(a.Key, b.Key))
	})
	return ps
}

// decoder walks the document table by table. Every value is first decoded as
// a toml.Primitive so that a wrong value does not stop the walk (all problems
// are reported at once) and so that its line can be found.
type decoder struct {
	file string
	md   toml.MetaData
	errs Errors
	// warnings are what a valid file is told: the deprecated keys it sets.
	warnings Errors
	tables   map[string]*table // the top-level tables, for cross-table checks
	decls    []decl            // the models, for cross-table checks
}

func (d *decoder) add(line int, key toml.Key, msg string) {
	d.errs = append(d.errs, Problem{File: d.file, Line: line, Key: key.String(), Message: msg})
}

// locator fails every decode; the ParseError the toml package wraps around
// that failure carries the position of the key being decoded, which the
// package exposes no other way.
type locator struct{}

var errLocate = errors.New("locate")

// UnmarshalTOML implements toml.Unmarshaler.
func (locator) UnmarshalTOML(any) error { return errLocate }

// line is the line of the value p was decoded from, 0 when unknown.
func (d *decoder) line(p toml.Primitive) int {
	var pe toml.ParseError
	if errors.As(d.md.PrimitiveDecode(p, &locator{}), &pe) {
		return pe.Position.Line
	}
	return 0
}

// table is one TOML table whose values are not decoded yet.
type table struct {
	path toml.Key
	line int
	keys map[string]toml.Primitive
}

// keyLine is the line of key name in t, or of t itself when name is absent.
func (d *decoder) keyLine(t *table, name string) int {
	if p, ok := t.keys[name]; ok {
		if l := d.line(p); l > 0 {
			return l
		}
	}
	return t.line
}

func child(path toml.Key, name string) toml.Key {
	return append(slices.Clone(path), name)
}

// open decodes p as a table, or reports that it is not one.
func (d *decoder) open(path toml.Key, p toml.Primitive) (*table, bool) {
	line := d.line(p)
	var raw any
	if err := d.md.PrimitiveDecode(p, &raw); err != nil {
		d.add(line, path, err.Error())
		return nil, false
	}
	if _, ok := raw.(map[string]any); !ok {
		d.add(line, path, wantType("a table", raw).Error())
		return nil, false
	}
	t := &table{path: path, line: line}
	if err := d.md.PrimitiveDecode(p, &t.keys); err != nil {
		d.add(line, path, err.Error())
		return nil, false
	}
	if t.line == 0 {
		// An implicit table ([models.x.environment] without [models.x])
		// has no line of its own: use its first key's.
		for _, cp := range t.keys {
			if l := d.line(cp); l > 0 && (t.line == 0 || l < t.line) {
				t.line = l
			}
		}
	}
	return t, true
}

// fields decodes every key of t with its setter; keys without one are
// unknown.
func (d *decoder) fields(t *table, schema map[string]setter) {
	for name, p := range t.keys {
		key := child(t.path, name)
		if why, ok := deprecatedKeys[key.String()]; ok {
			d.warnings = append(d.warnings, Problem{File: d.file, Line: d.line(p), Key: key.String(), Message: why})
			continue
		}
		set, ok := schema[name]
		if !ok {
			d.add(d.line(p), key, unknownKey(name, schema))
			continue
		}
		var raw any
		if err := d.md.PrimitiveDecode(p, &raw); err != nil {
			d.add(d.line(p), key, err.Error())
			continue
		}
		if err := set(raw); err != nil {
			d.add(d.line(p), key, err.Error())
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

func (d *decoder) decode(data []byte) *Config {
	var top map[string]toml.Primitive
	md, err := toml.Decode(string(data), &top)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			d.errs = append(d.errs, Problem{File: d.file, Line: pe.Position.Line, Message: pe.Message})
		} else {
			d.errs = append(d.errs, Problem{File: d.file, Message: err.Error()})
		}
		return nil
	}
	d.md = md
	cfg := Default()
	sections := map[string]func(*table){
		"agent":    func(t *table) { d.fields(t, agentSchema(&cfg.Agent)) },
		"gateway":  func(t *table) { d.fields(t, gatewaySchema(&cfg.Gateway)) },
		"policy":   func(t *table) { d.fields(t, policyTableSchema(&cfg.Policy)) },
		"pressure": func(t *table) { d.fields(t, pressureSchema(&cfg.Pressure)) },
		"models":   nil, // after [policy]: models inherit from it
	}
	for name, p := range top {
		if _, ok := sections[name]; !ok {
			d.add(d.line(p), toml.Key{name}, unknownKey(name, sections))
		}
	}
	d.tables = map[string]*table{}
	for _, name := range []string{"agent", "gateway", "policy", "pressure"} {
		if p, ok := top[name]; ok {
			if t, ok := d.open(toml.Key{name}, p); ok {
				d.tables[name] = t
				sections[name](t)
			}
		}
	}
	if p, ok := top["models"]; ok {
		if t, ok := d.open(toml.Key{"models"}, p); ok {
			cfg.Models = d.models(t, cfg)
		}
	}
	d.checkListens(cfg)
	return cfg
}

// checkListens reports two of napd's own listen addresses (gateway.listen,
// agent.metrics_listen, agent.haproxy_agent_listen, models.NAME.listen) that cannot both be bound:
// the same port on the same host, where "localhost" is 127.0.0.1 and ::1,
// and a wildcard host ("0.0.0.0", "::", "") takes the port on every
// address. Such a config would fail at start, so --check fails on it.
func (d *decoder) checkListens(cfg *Config) {
	type claim struct {
		addr, owner string
		line        int
		key         toml.Key
	}
	var claims []claim
	at := func(table, key string) (int, toml.Key) {
		t := d.tables[table]
		if t == nil {
			return 0, toml.Key{table, key}
		}
		return d.keyLine(t, key), child(t.path, key)
	}
	for _, l := range cfg.Gateway.Listen {
		line, k := at("gateway", "listen")
		claims = append(claims, claim{l, "gateway.listen", line, k})
	}
	for _, a := range []struct{ key, addr string }{
		{"metrics_listen", cfg.Agent.MetricsListen},
		{"haproxy_agent_listen", cfg.Agent.HAProxyAgentListen},
	} {
		if a.addr != "" {
			line, k := at("agent", a.key)
			claims = append(claims, claim{a.addr, "agent." + a.key, line, k})
		}
	}
	for _, dc := range d.decls {
		if dc.m.Listen != "" {
			claims = append(claims, claim{dc.m.Listen, "models." + dc.m.Name + ".listen", d.keyLine(dc.t, "listen"), child(dc.t.path, "listen")})
		}
	}
	for i, c := range claims {
		for _, prev := range claims[:i] {
			if listensOverlap(prev.addr, c.addr) {
				d.add(c.line, c.key, fmt.Sprintf("%s collides with %s %s: both cannot listen", c.addr, prev.owner, prev.addr))
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
		"sleep":             setEnum(&m.Sleep, sleepmode.Stop, sleepmode.VLLML1, sleepmode.VLLML2, sleepmode.SGLang, sleepmode.None),
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
		"warm_on_start":     setBool(&m.WarmOnStart),
		"keep_awake":        setWindows(&m.KeepAwake),
	})
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
	}
}

// setPolicy makes p the model's effective policy.
func (m *Model) setPolicy(p Policy) {
	m.IdleTimeout = p.IdleTimeout
	m.DrainTimeout = p.DrainTimeout
	m.ArrivalWhileDraining = p.ArrivalWhileDraining
	m.WakeAttempts = p.WakeAttempts
	m.WakeTimeout = p.WakeTimeout
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

func (d *decoder) models(t *table, cfg *Config) []*Model {
	// Models keep file order; the map from the decoder has none.
	var names []string
	for _, k := range d.md.Keys() {
		if len(k) >= 2 && k[0] == "models" && !slices.Contains(names, k[1]) {
			names = append(names, k[1])
		}
	}
	var decls []decl
	for _, name := range names {
		p, ok := t.keys[name]
		if !ok {
			continue
		}
		path := child(t.path, name)
		mt, ok := d.open(path, p)
		if err := validModelName(name); err != nil {
			d.add(d.line(p), path, err.Error())
		}
		if !ok {
			continue
		}
		m, pol := newModel(name), cfg.Policy
		d.fields(mt, modelSchema(m, &pol))
		m.setPolicy(pol)
		// [gateway] is decoded before the models.
		m.FairShare = pol.FairShare == FairShareOn || (pol.FairShare == FairShareAuto && cfg.Gateway.APIKeysFile != "")
		d.checkModel(m, mt)
		decls = append(decls, decl{m, mt})
	}
	d.checkUnique(decls, cfg)
	d.decls = decls
	models := make([]*Model, len(decls))
	for i, dc := range decls {
		models[i] = dc.m
	}
	return models
}

// checkModel checks the keys of one model against each other.
func (d *decoder) checkModel(m *Model, t *table) {
	_, hasCmd := t.keys["command"]
	_, hasUnit := t.keys["unit"]
	_, hasAddr := t.keys["address"]
	switch {
	case hasCmd && hasUnit:
		d.add(d.keyLine(t, "unit"), child(t.path, "unit"), "command and unit are both set: set exactly one")
	case !hasCmd && !hasUnit:
		d.add(t.line, t.path, "neither command nor unit is set: set command (napd runs the engine) or unit (an operator-managed unit)")
	}
	switch m.Transport {
	case TransportZMQ:
		if !hasAddr {
			d.add(t.line, t.path, `transport = "zmq" needs address`)
		}
		if m.Evidence != EvidenceAuto {
			d.add(d.keyLine(t, "evidence"), child(t.path, "evidence"), `a transport = "zmq" worker reports its own activity: leave evidence at "auto"`)
		}
		// The vLLM and SGLang strategies call HTTP endpoints a ZMQ worker has not.
		if m.Sleep != sleepmode.Stop && m.Sleep != sleepmode.None {
			d.add(d.keyLine(t, "sleep"), child(t.path, "sleep"), fmt.Sprintf(`sleep = %q needs an HTTP engine: a transport = "zmq" worker sleeps by "stop" or "none"`, m.Sleep))
		}
	case TransportHTTP:
		if hasAddr {
			d.add(d.keyLine(t, "address"), child(t.path, "address"), `only used with transport = "zmq"`)
		}
		if m.Port == 0 && m.Unit != "" && !hasCmd {
			d.add(d.keyLine(t, "unit"), child(t.path, "port"), "an operator-managed unit listens on a port of its own: set port")
		}
		if m.Port == 0 && hasCmd && !hasUnit && len(m.Command) > 0 && !mentionsPort(m) {
			d.add(d.keyLine(t, "command"), child(t.path, "command"),
				"port = 0 lets napd pick the port: pass ${PORT} in command or environment so the engine listens on it")
		}
	}
	if m.GPUCount > 0 && hasUnit {
		d.add(d.keyLine(t, "gpus"), child(t.path, "gpus"),
			"napd cannot choose the GPUs of an operator-managed unit: list them (gpus = [0]) or use command")
	}
	if _, set := t.keys["activity_metrics"]; set && m.Evidence != EvidenceAuto && m.Evidence != EvidenceMetrics {
		d.add(d.keyLine(t, "activity_metrics"), child(t.path, "activity_metrics"),
			fmt.Sprintf(`only used with evidence = "auto" or "metrics", not %q`, m.Evidence))
	}
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

func mentionsPort(m *Model) bool {
	for _, s := range m.Command {
		if strings.Contains(s, portVar) {
			return true
		}
	}
	for _, s := range m.Environment {
		if strings.Contains(s, portVar) {
			return true
		}
	}
	return false
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
	aliasOwner := map[string]string{}
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
		key := func(k string) (int, toml.Key) { return d.keyLine(dc.t, k), child(dc.t.path, k) }
		for _, a := range m.Aliases {
			line, k := key("aliases")
			switch owner, dup := aliasOwner[a]; {
			case isModel[a]:
				d.add(line, k, fmt.Sprintf("alias %q is the name of model %s", a, a))
			case dup && owner == m.Name:
				d.add(line, k, fmt.Sprintf("alias %q is listed twice", a))
			case dup:
				d.add(line, k, fmt.Sprintf("alias %q is already an alias of model %s", a, owner))
			default:
				aliasOwner[a] = m.Name
			}
		}
		if m.Port != 0 && m.Transport == TransportHTTP {
			line, k := key("port")
			if owner, dup := portOwner[m.Port]; dup {
				d.add(line, k, fmt.Sprintf("port %d is already used by model %s", m.Port, owner))
			} else {
				portOwner[m.Port] = m.Name
			}
			if owner, ok := listenPort[m.Port]; ok {
				d.add(line, k, fmt.Sprintf("port %d is napd's own: %s listens on it", m.Port, owner))
			}
		}

	}
}
