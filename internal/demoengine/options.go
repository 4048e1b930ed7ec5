package demoengine

import (
	"log/slog"
	"time"
)

// Options configures an Engine. The zero value is a usable, instant engine
// serving one model called "demo" without sleep mode.
type Options struct {
	// Models are the served model names; the first labels the metrics.
	// Empty means ["demo"].
	Models []string
	// StartupDelay is how long the engine "loads": until it passes, every
	// endpoint except /debug/ answers 503.
	StartupDelay time.Duration
	// LoadFiles are read whole at start, as an engine reads its weights:
	// /health answers 503 until they are read (and StartupDelay passed).
	// LoadPaths expands a directory into its files.
	LoadFiles []string
	// LoadRate paces that read in bytes per second; 0 means as fast as the
	// disk (or the page cache) gives them.
	LoadRate int64
	// TTFT is the delay before the first token of every completion.
	TTFT time.Duration
	// TokensPerSecond paces the tokens after the first; 0 means no delay.
	TokensPerSecond float64
	// SleepMode serves vLLM's dev endpoints (/sleep, /wake_up, /is_sleeping,
	// /collective_rpc, /reset_prefix_cache) and SGLang's
	// /release_memory_occupation and /resume_memory_occupation.
	SleepMode bool
	// WakeDelay is how long a wake_up (or resume) takes.
	WakeDelay time.Duration
	// MemoryBytes is the size of the emulated weights: allocated and
	// touched so that it is resident, kept by a level-1 sleep, freed by a
	// level-2 sleep and allocated again by the wake.
	MemoryBytes int64
	// Flavor is the engine whose status and metric endpoints are served
	// (Flavor* constants); "" means FlavorVLLM.
	Flavor string
	// Metrics enables llama.cpp's /metrics (FlavorLlamaCpp; llama.cpp's
	// --metrics).
	Metrics bool
	// SleepIdle is llama.cpp's --sleep-idle-seconds: after this long
	// without a task the engine frees its weights by itself, /props says
	// is_sleeping, and the next task reloads them (taking WakeDelay). 0
	// means never.
	SleepIdle time.Duration
	// HangHealth makes /health never answer.
	HangHealth bool
	// BusyHealth makes /health not answer while a completion runs, like a
	// server that answers nothing while it generates.
	BusyHealth bool
	// CrashAfter makes the engine exit with status 3 on its Nth completion:
	// a non-streamed one after its answer is sent, a streamed one after a
	// few chunks. 0 disables it.
	CrashAfter int
	// MaxNumSeqs is how many completions run at once; the rest wait
	// (vllm:num_requests_waiting). 0 means 256, vLLM's default.
	MaxNumSeqs int
	// PriorityScheduling is vLLM's --scheduling-policy priority: a
	// completion's own "priority" field is accepted (and counted in
	// Stats.Priorities); without it a non-zero priority is refused with
	// 400, as vLLM refuses it. The emulator does not reorder by it.
	PriorityScheduling bool
	// Exit ends the process; nil means os.Exit. Tests replace it.
	Exit func(code int)
	// Logger receives control-plane events; nil means slog.Default().
	Logger *slog.Logger
}

// CrashExitCode is the exit status of a --crash-after crash.
const CrashExitCode = 3

const defaultMaxNumSeqs = 256
