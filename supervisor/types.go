// Package supervisor starts, stops, sleeps, wakes and health-checks inference
// engines. A Backend runs the engine process (a systemd unit over D-Bus, or a
// child process group); the Supervisor on top of it adds sleep strategies and
// verified health, the same for every backend.
//
// It owns how an engine is started, stopped, put to sleep, woken and
// verified, and what a backend may be asked (Backend and the optional
// interfaces). It must not know napd's config, lifecycle or leases: a Spec
// is all it is told, and calls for one model are serialised by the caller.
// Backend-specific code stays under supervisor/: callers use the Supervisor,
// never a concrete backend.
package supervisor

import (
	"context"
	"log/slog"
	"strconv"
	"time"
)

// Spec is everything a backend needs to run one model's engine. The agent
// builds it from the config; ${PORT} and ${GPUS} are already expanded.
type Spec struct {
	Model       string
	Command     []string // set when napd owns the process
	Unit        string   // set when an operator-owned unit is controlled instead
	Port        int
	Environment map[string]string
	GPUs        []int // napd's GPU indexes of the placement
	// Devices are those GPUs as their vendors' runtimes know them (see
	// VisibleDevices); empty when no GPU reading resolved them.
	Devices          []GPU
	WorkingDirectory string
	User             string
	Health           string // health path, e.g. "/health"
	Sleep            string // sleep strategy (a sleepmode constant)
	StopTimeout      time.Duration
	// Container, when set, runs the engine as a container
	// (supervisor/container): Command is then the container's command and
	// arguments, Environment its environment, GPUs the devices passed in.
	Container *Container
	// PIDFile and StopCommand shape napd's transient unit (the systemd
	// backend) for an engine that another program starts, a container
	// runtime's client; supervisor/container sets them. PIDFile makes the
	// unit Type=forking: Command starts the engine and exits, and the
	// unit's main process is the one the file names (podman's conmon).
	// StopCommand is the unit's ExecStop=, how the engine is asked to stop
	// before systemd signals what is left (a docker container is its
	// daemon's child, not the client's).
	PIDFile     string
	StopCommand []string
}

// Container is how a container engine runs: the model's image keys.
type Container struct {
	Runtime string   // "podman" or "docker"
	Program string   // the runtime's executable (absolute path)
	Image   string   // the image reference
	Volumes []string // "SOURCE:DEST[:OPTIONS]"
	Args    []string // more flags of the create line (container_args)
	Pull    string   // "never" or "missing"
	// Port is the container's own port, published on 127.0.0.1:Spec.Port;
	// 0: the container shares the host's network and listens on Spec.Port.
	Port int
}

// BaseURL is the engine's HTTP root on loopback.
func (s Spec) BaseURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(s.Port)
}

// UnitName is the systemd unit that runs the engine: the operator's unit, or
// napd's transient napd-engine-<model>.service.
func (s Spec) UnitName() string {
	if s.Unit != "" {
		return s.Unit
	}
	return UnitPrefix + s.Model + ".service"
}

// UnitPrefix starts the name of every transient unit napd creates.
const UnitPrefix = "napd-engine-"

// ProcState is what a backend can tell about an engine's process.
type ProcState int

const (
	// ProcUnknown: the backend could not tell (no answer).
	ProcUnknown ProcState = iota
	// ProcStopped: no process runs (never started, or stopped cleanly).
	ProcStopped
	// ProcStarting: the process/unit is starting or running but not yet
	// known to be healthy.
	ProcStarting
	// ProcRunning: the process/unit runs.
	ProcRunning
	// ProcFailed: the process exited on its own or the unit failed.
	ProcFailed
)

func (s ProcState) String() string {
	switch s {
	case ProcStopped:
		return "stopped"
	case ProcStarting:
		return "starting"
	case ProcRunning:
		return "running"
	case ProcFailed:
		return "failed"
	}
	return "unknown"
}

// Status is a backend's view of one engine.
type Status struct {
	State  ProcState
	Reason string // exit status, systemd Result, … ("" when nothing to say)
	Unit   string // unit name (systemd) or "" (exec)
	PIDs   []int  // processes of the engine (cgroup or process group)
	// MemoryBytes is the engine's own memory (cgroup memory.current /
	// systemd MemoryCurrent); HaveMemory is false when not measured.
	MemoryBytes int64
	HaveMemory  bool
}

// Event is a change of an engine's process state, with its reason. Backends
// deliver them as they happen (D-Bus signals, wait(2)), never by polling.
type Event struct {
	Model  string
	State  ProcState
	Reason string
	Time   time.Time
}

// Kind names a backend, as agent.supervisor spells it; KindAuto lets
// supervisor/backend choose.
type Kind string

// Backend kinds.
const (
	KindAuto    Kind = "auto"    // systemd when it answers on D-Bus, else exec
	KindSystemd Kind = "systemd" // transient units over D-Bus (supervisor/systemd)
	KindExec    Kind = "exec"    // child process groups of napd (supervisor/process)
)

// OpenOptions are what a backend needs to open (supervisor/backend.Open).
type OpenOptions struct {
	// StateDir is napd's state directory: the exec backend keeps its
	// engines' logs and records under it.
	StateDir string
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// ContainerRuntimes are the container runtimes the config's models
	// use (name -> executable): their containers of napd's are swept at
	// start (supervisor/container).
	ContainerRuntimes map[string]string
}

// Backend runs engine processes. Implementations: exec (process groups) and
// systemd (transient units over D-Bus). All methods are safe for concurrent
// use; calls for one model are serialised by the caller.
type Backend interface {
	// Name is "systemd" or "exec".
	Name() string
	// Start starts the engine and returns once the process/unit is started
	// (systemd: the start job finished "done"); it does not wait for health.
	Start(ctx context.Context, spec Spec) error
	// Stop stops the engine (SIGTERM to the group, SIGKILL after
	// spec.StopTimeout) and returns once it is gone.
	Stop(ctx context.Context, spec Spec) error
	// Status reports the engine's process state.
	Status(ctx context.Context, spec Spec) (Status, error)
	// Running lists the models whose engines this backend finds running or
	// loaded (systemd: napd-engine-* units), for reconciliation at start.
	Running(ctx context.Context) ([]string, error)
	// Events streams process state changes. The channel is closed by Close.
	Events() <-chan Event
	// Close releases the backend. exec: stops every engine (no orphans).
	// systemd: leaves units running (they are adopted on the next start).
	Close() error
}

// Send delivers ev on a backend's buffered event channel: at once while
// the buffer has room, else when a reader takes it; it drops ev only once
// quit is closed (the backend is closing and nobody may read any more).
func Send(events chan<- Event, quit <-chan struct{}, ev Event) {
	select {
	case events <- ev:
		return
	default:
	}
	select {
	case events <- ev:
	case <-quit:
	}
}
