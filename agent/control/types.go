// Package control is napd's control API: HTTP over the unix socket
// agent.control_socket, used by napctl. The server side adapts a Controller
// (the agent); the client side is what napctl calls.
//
// Endpoints (all JSON):
//
//	GET  /v1/status                      Status
//	POST /v1/models/{model}/wake         NDJSON stream of Progress, ending with Done
//	POST /v1/models/{model}/sleep        ?strategy=stop|vllm-l1|… (default: the model's)
//	POST /v1/models/{model}/reset        clears failed
//	GET  /v1/models/{model}/logs         ?lines=N: the engine's last output lines
//	GET  /v1/events                      NDJSON stream of Event
//	POST /v1/reload                      reload the config file (as SIGHUP)
//	GET  /v1/usage                       ?since=24h: Usage, GPU time and more per key
//
// The gateway serves status, wake, sleep, reset, usage and events (as
// SSE) to admins under /napd/v1/… (AdminHandler).
//
// It owns the wire format of the control API and its handlers; the state it
// reports belongs to the Controller. It must not keep model state of its own
// or act on a model but through the Controller.
package control

import (
	"context"
	"github.com/napd/napd/agent/loadprogress"
	"time"
)

// Status is the whole agent at a glance.
type Status struct {
	Version    string        `json:"version"`
	Supervisor string        `json:"supervisor"`
	Config     string        `json:"config"`
	Started    time.Time     `json:"started"`
	Models     []ModelStatus `json:"models"`
	Host       HostMemory    `json:"host"`
	GPUs       []GPUMemory   `json:"gpus,omitempty"`
	// Usage is each key's use of each model in the last 24 hours (see
	// Usage); Quotas the day's use of the keys with a quota.
	Usage  []UsageRow `json:"usage,omitempty"`
	Quotas []Quota    `json:"quotas,omitempty"`
}

// Usage is what each key's requests used of each model in the whole hours
// from Since (docs/keys.md#gpu-time).
type Usage struct {
	Since  time.Time  `json:"since"`
	Rows   []UsageRow `json:"rows"`
	Quotas []Quota    `json:"quotas,omitempty"`
}

// UsageRow is one key's use of one model.
type UsageRow struct {
	Key   string `json:"key"`
	Model string `json:"model"`
	// GPUByteSeconds is the GPU memory held on the key's behalf,
	// integrated; GPUHours the same as whole GPUs.
	GPUByteSeconds   float64 `json:"gpu_byte_seconds"`
	GPUHours         float64 `json:"gpu_hours"`
	Wakes            int64   `json:"wakes"` // wakes the key's requests started
	Swaps            int64   `json:"swaps"` // of those, wakes that waited for others' memory
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
}

// Quota is a key's use today against its quotas (0: none of that kind).
type Quota struct {
	Key            string    `json:"key"`
	GPUHours       float64   `json:"gpu_hours"`
	GPUHoursPerDay float64   `json:"gpu_hours_per_day,omitempty"`
	Tokens         int64     `json:"tokens"`
	TokensPerDay   int64     `json:"tokens_per_day,omitempty"`
	Renews         time.Time `json:"renews"` // the end of the day
}

// MaxUsageSince is the longest ?since= of /v1/usage: the hours napd keeps.
const MaxUsageSince = 7 * 24 * time.Hour

// ModelStatus is one model's row.
type ModelStatus struct {
	Name    string   `json:"name"`
	Aliases []string `json:"aliases,omitempty"`
	State   string   `json:"state"`
	Reason  string   `json:"reason,omitempty"`
	// StateSince is when the model entered State.
	StateSince time.Time `json:"state_since,omitzero"`
	Unit       string    `json:"unit,omitempty"`
	Port       int       `json:"port,omitempty"`
	Transport  string    `json:"transport"`
	Sleep      string    `json:"sleep"`
	Pinned     bool      `json:"pinned,omitempty"`
	Leases     int       `json:"leases"`
	QueueDepth int       `json:"queue_depth"`
	// IdleSince is set while no lease is live: the end of the last lease,
	// the last wake or the last time the engine was seen at work (a
	// client outside napd), whichever is later (measure.Measurement.IdleSince).
	IdleSince *time.Time `json:"idle_since,omitempty"`
	// LastWakeMs is the duration of the last successful wake.
	LastWakeMs int64 `json:"last_wake_ms,omitempty"`
	// Load is the load's progress while the model wakes, when measured.
	Load     *LoadProgress `json:"load,omitempty"`
	Attempts int           `json:"wake_attempts,omitempty"`
	// EngineBytes is the engine's host memory (cgroup); absent when not measured.
	EngineBytes *int64 `json:"engine_memory_bytes,omitempty"`
	// GPUBytes is GPU memory held by the engine, per GPU index.
	GPUBytes map[string]int64 `json:"gpu_memory_bytes,omitempty"`
	// Footprint is the expected GPU footprint: configured, measured, or
	// estimated before the first wake (FootprintSource says which;
	// FootprintFrom what an estimate was made from).
	Footprint int64 `json:"footprint_bytes,omitempty"`
	// Weights is the size of the model's weight files napd knows of,
	// WeightsResident how much of them is in the page cache (nil: no
	// weight files known; docs/memory.md#weights-kept-warm).
	Weights         int64           `json:"weights_bytes,omitempty"`
	WeightsResident *int64          `json:"weights_resident_bytes,omitempty"`
	FootprintSource FootprintSource `json:"footprint_source,omitempty"`
	FootprintFrom   string          `json:"footprint_from,omitempty"`
	// GPUs are the GPUs the model runs on or wakes on: its fixed list, or
	// the set napd chose last (gpus = "any" or { count = N }), with
	// Placement saying why, with the figures.
	GPUs      []int  `json:"gpus,omitempty"`
	Placement string `json:"placement,omitempty"`
	// SleptWith is the strategy a sleeping engine sleeps with: the level
	// of the sleep ladder reached ("" when awake or unknown).
	SleptWith string `json:"slept_with,omitempty"`
	// RoomWaiting is how many requests wait for the model's wake to get
	// GPU memory, and WaitingFor the holders of that memory.
	RoomWaiting int    `json:"room_waiting,omitempty"`
	WaitingFor  string `json:"waiting_for,omitempty"`
	// Remote is the url of a model served elsewhere, and RemoteState
	// what a remote napd says of it (its /v1/models napd.state; "" when
	// the remote is no napd).
	Remote      string `json:"remote,omitempty"`
	RemoteState string `json:"remote_state,omitempty"`
}

// HostMemory is the host's memory figures; zero-valued fields were not measured.
type HostMemory struct {
	TotalBytes     int64    `json:"total_bytes,omitempty"`
	AvailableBytes int64    `json:"available_bytes,omitempty"`
	PSISomeAvg10   *float64 `json:"psi_some_avg10,omitempty"`
}

// GPUMemory is one GPU's memory figures.
type GPUMemory struct {
	Index int `json:"index"`
	// Vendor is "nvidia", "amd" or "intel"; UUID NVIDIA's GPU-… or MIG-…
	// (a MIG instance is a GPU of its own); PCI a DRM card's address.
	Vendor     string `json:"vendor,omitempty"`
	UUID       string `json:"uuid,omitempty"`
	PCI        string `json:"pci,omitempty"`
	Name       string `json:"name,omitempty"`
	TotalBytes int64  `json:"total_bytes"`
	UsedBytes  int64  `json:"used_bytes"`
	FreeBytes  int64  `json:"free_bytes"`
}

// Event is a model state change, with its reason.
type Event struct {
	Time   time.Time `json:"time"`
	Model  string    `json:"model"`
	Kind   EventKind `json:"kind"`
	From   string    `json:"from,omitempty"`
	To     string    `json:"to,omitempty"`
	Reason string    `json:"reason,omitempty"`
	// WakeMs is the wake's duration on a "wake" event that succeeded.
	WakeMs int64 `json:"wake_ms,omitempty"`
	// Load is a waking engine's load progress, on a "load" event.
	Load *LoadProgress `json:"load,omitempty"`
}

// LoadProgress is how far a waking engine's load got
// (docs/lifecycle.md#load-progress).
type LoadProgress = loadprogress.Wire

// FootprintSource is where a model's expected GPU footprint comes from.
type FootprintSource string

// Footprint sources.
const (
	FootprintConfigured FootprintSource = "gpu_memory" // the model's gpu_memory
	FootprintMeasured   FootprintSource = "measured"   // learned while it was awake
	FootprintEstimated  FootprintSource = "estimated"  // from its command or files, before its first wake
)

// EventKind classifies an event; its spelling is the wire's ("kind", and
// the SSE event name of /napd/v1/events).
type EventKind string

// Event kinds.
const (
	EventState    EventKind = "state"    // a lifecycle state change: From, To, Reason
	EventWake     EventKind = "wake"     // a wake finished; WakeMs when it succeeded
	EventSleep    EventKind = "sleep"    // a model was put to sleep, or deeper
	EventDecision EventKind = "decision" // a planner decision: Reason says it
	EventLoad     EventKind = "load"     // a waking engine's load progress: Load
	EventReload   EventKind = "reload"   // the config was reloaded (no Model)
)

// Progress is one line of a wake's progress stream. The last line has Done set.
type Progress struct {
	Phase     string `json:"phase"` // "waking", "verifying", "awake", "failed", …
	ElapsedMs int64  `json:"elapsed_ms"`
	Done      bool   `json:"done,omitempty"`
	Error     string `json:"error,omitempty"`
	// Load is the load's progress while the engine wakes, when measured.
	Load *LoadProgress `json:"load,omitempty"`
}

// Controller is what the server asks of the agent.
type Controller interface {
	Status() Status
	// Wake wakes model and returns once it is awake (nil) or the wake
	// failed; progress is called on each phase change and each reading of
	// the load's progress (Phase and Load set).
	Wake(ctx context.Context, model string, progress func(Progress)) error
	// Sleep puts model to sleep with strategy ("" = the model's own).
	Sleep(ctx context.Context, model, strategy string) error
	// Reset clears a failed model.
	Reset(model string) error
	// Reload re-reads the config file.
	Reload() error
	// Logs returns the last lines of the engine's output (exec backend;
	// under systemd the error says which journal holds it).
	Logs(model string, lines int) ([]string, error)
	// Subscribe streams events until cancel is called.
	Subscribe() (events <-chan Event, cancel func())
	// Usage is each key's use of each model in the whole hours since
	// since ago (at most MaxUsageSince).
	Usage(since time.Duration) Usage
}

// Logs is the body of a logs reply.
type Logs struct {
	Lines []string `json:"lines"`
}

// Error is the body of every non-2xx reply.
type Error struct {
	Error string `json:"error"`
}
