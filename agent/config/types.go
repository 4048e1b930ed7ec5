// Package config loads and validates napd's TOML configuration
// (/etc/napd/napd.toml). The types here are the resolved form every other
// part of napd reads: sizes are bytes, durations are time.Duration, and each
// model carries its effective policy (its own value or the [policy] default).
//
// It owns the file's syntax, defaults and validation. It must not start,
// open or change anything napd runs: Load only reads and checks, and a
// config error names the file, the key and the line.
package config

import (
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/supervisor"
)

// The vocabularies of agent.supervisor (supervisor.Kind) and
// policy.arrival_while_draining (lifecycle.ArrivalPolicy) are their
// packages'; sleep strategies are sleepmode's.

// Transport is models.NAME.transport: how napd reaches the engine.
type Transport string

// Transports.
const (
	TransportHTTP Transport = "http"
	TransportZMQ  Transport = "zmq"
)

// Evidence is models.NAME.evidence: what proves a model idle besides
// napd's own leases.
type Evidence string

// Evidence sources.
const (
	// EvidenceAuto: the engine's activity metrics when it publishes them,
	// else the connections to its port.
	EvidenceAuto        Evidence = "auto"
	EvidenceConnections Evidence = "connections"
	EvidenceMetrics     Evidence = "metrics"
	// EvidenceLeases: napd's leases only; allow_untracked_unload decides.
	EvidenceLeases Evidence = "leases"
)

// Config is a loaded, validated configuration.
type Config struct {
	// Path is the main file it was read from; DropIns the files of its
	// include directory that were read after it, in order.
	Path     string
	DropIns  []string
	Agent    Agent
	Gateway  Gateway
	Policy   Policy
	Pressure Pressure
	// Models in the order they appear in the files.
	Models []*Model

	shown []shownTable // for Show and Settings
	// Warnings are what is wrong with the file but does not stop napd:
	// deprecated keys it sets, ignored, each with what to do instead.
	// napd logs them at start and reload; napd --check prints them.
	Warnings Errors
}

// Agent is the [agent] table.
type Agent struct {
	Supervisor    supervisor.Kind
	StateDir      string
	ControlSocket string
	MetricsListen string // "" = off
	EventsAddress string // "" = off
	// HAProxyAgentListen is the HAProxy agent-check address; "" = off.
	HAProxyAgentListen string
	LogLevel           string // "debug" | "info" | "warn" | "error"
	// IncludeDir holds drop-ins read after the main file; relative to the
	// main file's directory (see Config.DropInDir); "" = none.
	IncludeDir string
	// ContainerRuntime is the default runtime of container engines:
	// RuntimeAuto, RuntimePodman or RuntimeDocker.
	ContainerRuntime string
}

// Gateway is the [gateway] table.
type Gateway struct {
	Listen           []string
	MaxBody          int64
	RequestTimeout   time.Duration
	APIKeysFile      string
	KeepaliveTimeout time.Duration // 0 = no keep-alive: one request per connection
	WriteTimeout     time.Duration
	MaxConnections   int
	UpstreamDeny     []string // added to pathrule.DefaultDeny
	UpstreamAllow    []string // exempted from it
	// Routes are the paths outside /v1 routed by model.
	Routes      []Route
	ListAliases bool
	// CORSOrigins are the browser origins allowed; "*" is any.
	CORSOrigins []string
}

// Route is one entry of gateway.routes: a path outside /v1 that the
// gateway routes to a model, by the JSON body's `model` (POST) or by the
// `?model=` query parameter (GET).
type Route struct {
	Method string // "POST" | "GET"
	Path   string
}

// DefaultRoutes are llama.cpp's inference routes; its routes that change
// the engine (POST /props, /slots) are left out on purpose.
func DefaultRoutes() []Route {
	return []Route{
		{"POST", "/completion"}, {"POST", "/infill"}, {"POST", "/rerank"},
		{"POST", "/embedding"}, {"POST", "/tokenize"}, {"POST", "/detokenize"},
		{"GET", "/props"},
	}
}

// Policy is the [policy] table: defaults every model inherits.
type Policy struct {
	IdleTimeout          time.Duration // 0 = never unload for idleness
	DrainTimeout         time.Duration
	ArrivalWhileDraining lifecycle.ArrivalPolicy
	WakeAttempts         int
	WakeTimeout          time.Duration
	// WakeStallTimeout fails a wake attempt whose load showed no progress
	// that long (docs/lifecycle.md#load-progress); 0: off.
	WakeStallTimeout     time.Duration
	AllowUntrackedUnload bool
	HealthInterval       time.Duration // 0 = awake engines are not probed
	HealthFailures       int
	// YieldAfter is how long a busy model keeps admitting new requests
	// after another model started waiting for its GPU memory.
	YieldAfter time.Duration
	// FairShare is FairShareAuto, FairShareOn or FairShareOff: whether a
	// model's queue admits round-robin by client (API key name).
	FairShare string
	// DeepSleep is the deeper strategy (sleepmode.Stop, or sleepmode.None
	// for no ladder) a model asleep in a light one (vllm-l1, vllm-l2,
	// sglang: the engine process stays) moves to after DeepSleepAfter, or
	// at once under host memory pressure.
	DeepSleep      string
	DeepSleepAfter time.Duration
	// MaxAwake is how many models may be awake at once (0 = unlimited):
	// the least recently used idle one makes room for a new wake. Only in
	// [policy].
	MaxAwake int

	// Priority classes (docs/scheduling.md), only in [policy]: their
	// names, highest first; how long a queued request waits to count as
	// one class higher (the starvation bound); and how soon a busy model
	// serving only a class yields to a waiting model of a higher class,
	// by class name (a class not listed yields after the model's
	// yield_after).
	Priorities         priority.Classes
	PriorityAge        time.Duration
	PriorityYieldAfter map[string]time.Duration
	// WarmWeights is how much of the stopped models' weight files napd
	// keeps in the page cache (docs/memory.md): WarmWeightsAuto, 0 (off)
	// or a size in bytes. Only in [policy].
	WarmWeights int64
}

// WarmWeightsAuto is warm_weights = "auto": what host memory allows above
// host_reserve.
const WarmWeightsAuto int64 = -1

// Values of policy.fair_share.
const (
	FairShareAuto = "auto" // on when gateway.api_keys_file is set
	FairShareOn   = "on"
	FairShareOff  = "off"
)

// Pressure is the [pressure] table.
type Pressure struct {
	GPUReserve   int64
	HostReserve  int64
	PSISomeAvg10 float64
}

// Model is one [models.NAME] table with every policy value resolved.
type Model struct {
	Name string

	// Exactly one of Command and Unit is set.
	Command []string // ${PORT} and ${GPUS} not yet expanded: see ExpandPort, ExpandGPUs
	Unit    string

	Port    int // 0 = allocate a free port at start
	Aliases []string
	Health  string // path, default "/health"
	Sleep   string // one of the sleepmode constants
	// SelfSleep is, with Sleep "llamacpp", the engine's own idle sleep
	// (llama-server --sleep-idle-seconds: the command's, or the one napd
	// added from idle_timeout); 0 when it has none or napd cannot know
	// (an operator's unit).
	SelfSleep time.Duration
	GPUs      []int // a fixed list; nil when GPUCount > 0
	// GPUCount > 0: napd chooses that many GPUs at each wake (gpus = "any"
	// is 1, gpus = { count = N } is N); 0: GPUs is fixed.
	GPUCount         int
	GPUMemory        int64 // bytes; 0 = unknown, learned when awake
	MaxConcurrency   int
	Queue            int
	Pinned           bool
	Environment      map[string]string
	Listen           string // optional dedicated gateway socket
	ServedName       string // the name the engine knows the model by; "" = Name
	Transport        Transport
	Address          string // ZMQ address when Transport == "zmq"
	WorkingDirectory string
	User             string
	StopTimeout      time.Duration
	Evidence         Evidence
	ActivityMetrics  []string // metric names whose sum counts work in flight

	// Effective policy: the model's own value, else [policy]'s.
	IdleTimeout          time.Duration
	DrainTimeout         time.Duration
	ArrivalWhileDraining lifecycle.ArrivalPolicy
	WakeAttempts         int
	WakeTimeout          time.Duration
	WakeStallTimeout     time.Duration
	AllowUntrackedUnload bool
	HealthInterval       time.Duration
	HealthFailures       int
	YieldAfter           time.Duration
	DeepSleep            string
	DeepSleepAfter       time.Duration
	// FairShare: the queue admits round-robin by client label rather than
	// by arrival (policy.fair_share, "auto" resolved against the keys).
	FairShare bool

	// Priority is the class of the model's requests whose key has none
	// (and of every request when keys are off). EnginePriority: the
	// engine honours a request's own priority field (vLLM started with
	// --scheduling-policy priority), which napd sets from the class.
	Priority       priority.Class
	EnginePriority bool
	// PriorityAge is [policy] priority_age: a queued request counts as
	// one class higher per PriorityAge waited.
	PriorityAge time.Duration

	// WakeProgress: a streaming request that waits for this model's wake
	// gets its 200 headers early and SSE comments until the first token.
	WakeProgress bool

	// Listed: shown in the gateway's model lists (/v1/models, the router
	// API's /models); false hides it there, and it is still served by
	// name (llama-swap's unlisted).
	Listed bool

	// WarmOnStart: woken at napd's start, after reconciliation, when it
	// fits. KeepAwake: windows in which it is not put to sleep for
	// idleness, and is woken at their start when it fits.
	WarmOnStart bool
	KeepAwake   []Window
	// Weights are the model's weight files and directories (absolute,
	// checked to exist at load) napd keeps warm besides those its command
	// names.
	Weights []string

	// A container engine (docs/containers.md): Image is set, Command is
	// the container's command and arguments (may be empty: the image's
	// own), Environment the container's environment.
	Image string
	// ContainerRuntime is RuntimePodman or RuntimeDocker, resolved from
	// agent.container_runtime when the model sets none; ContainerProgram
	// is its executable, found on PATH.
	ContainerRuntime string
	ContainerProgram string
	Volumes          []string // SOURCE:DEST[:OPTIONS]
	ContainerArgs    []string // more flags of the create line
	Pull             string   // PullNever or PullMissing
	ContainerPort    int      // published as 127.0.0.1:Port; 0 = the host's network

	// A remote model (docs/remote.md): URL is set, and napd runs no engine
	// for it. URL is the remote's OpenAI base URL (ending in /v1) or its
	// root; APIKeyFile holds the credential napd sends, in APIKeyHeader
	// (Authorization: as "Bearer KEY"); TLSCAFile is the CA its TLS
	// certificate is checked against instead of the system's.
	URL          string
	APIKeyFile   string
	APIKeyHeader string
	TLSCAFile    string
	// Overflow names the remote models a request for this local model is
	// sent to, in order, when napd cannot serve it here in time;
	// OverflowWhen (OverflowRefused or OverflowLate) says when.
	Overflow     []string
	OverflowWhen string
}

// Remote reports a model served elsewhere (url is set).
func (m *Model) Remote() bool { return m.URL != "" }
