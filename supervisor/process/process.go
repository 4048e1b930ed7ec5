//go:build linux

// Package process is the exec supervisor backend: each engine runs as a
// child of napd in its own process group, for hosts without systemd (a
// laptop, a CI box). Stop signals the whole group, an exit is noticed at once
// by a goroutine in wait(2), and output goes to a bounded, rotated log per
// model under <state_dir>/logs.
//
// It owns its child processes and their logs. It must not outlive napd's
// intent: engines die with napd (Pdeathsig), and a restarted napd kills what
// a crashed one left running before anything starts.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napd/napd/internal/statefile"
	"github.com/napd/napd/supervisor"
)

// Defaults for Options.
const (
	DefaultLogMaxBytes = 10 << 20
	DefaultLogKeep     = 3
	// DefaultStopTimeout applies when a Spec has no StopTimeout.
	DefaultStopTimeout = 10 * time.Second
)

// groupGoneWait bounds how long an exit waits for the rest of a killed
// process group to disappear (a process in uninterruptible sleep in a GPU
// driver can take a moment after SIGKILL).
const groupGoneWait = 5 * time.Second

// outputGrace is how long output may still drain after the whole group is
// gone, for a process that escaped the group but holds the pipe.
const outputGrace = time.Second

// Options configure a Backend.
type Options struct {
	// StateDir is napd's state directory; logs go to StateDir/logs.
	StateDir string
	// Logger receives the backend's logs; nil means slog.Default().
	Logger *slog.Logger
	// LogMaxBytes rotates a model's log before it grows past this size
	// (default DefaultLogMaxBytes).
	LogMaxBytes int64
	// LogKeep is how many rotated logs (<model>.log.1 …) are kept (default
	// DefaultLogKeep).
	LogKeep int
}

// Backend runs engines as child process groups. It implements
// supervisor.Backend.
type Backend struct {
	opts   Options
	log    *slog.Logger
	fs     procFS
	logDir string

	events    chan supervisor.Event
	quit      chan struct{} // closed by Close: events nobody reads are dropped
	closeOnce sync.Once
	wg        sync.WaitGroup

	groupsPath string // <state_dir>/engines.json

	mu      sync.Mutex
	engines map[string]*engine
	logs    map[string]*logFile
	groups  map[string]groupRecord // running engines' groups, as in groupsPath
	closed  bool
}

var _ supervisor.Backend = (*Backend)(nil)

// engine is one started process group. Fields below mu are guarded by
// Backend.mu.
type engine struct {
	pid         int           // the group leader; also the process group ID
	done        chan struct{} // closed once the leader is reaped and the group killed
	stopTimeout time.Duration // the spec's, for Close

	stopping bool
	state    supervisor.ProcState
	reason   string
}

// New returns a backend that keeps logs under opts.StateDir/logs. Before it
// returns, it kills what engines of a previous napd left running (see
// groupsFile).
func New(opts Options) (*Backend, error) {
	if opts.StateDir == "" {
		return nil, errors.New("exec backend: no state directory")
	}
	if opts.LogMaxBytes <= 0 {
		opts.LogMaxBytes = DefaultLogMaxBytes
	}
	if opts.LogKeep <= 0 {
		opts.LogKeep = DefaultLogKeep
	}
	logDir := filepath.Join(opts.StateDir, "logs")
	if err := statefile.Dir(logDir, 0o750); err != nil {
		return nil, fmt.Errorf("exec backend: engine logs: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	b := &Backend{
		opts:       opts,
		log:        log.With("backend", "exec"),
		fs:         hostFS,
		logDir:     logDir,
		groupsPath: filepath.Join(opts.StateDir, groupsFile),
		events:     make(chan supervisor.Event, 64),
		quit:       make(chan struct{}),
		engines:    make(map[string]*engine),
		logs:       make(map[string]*logFile),
		groups:     make(map[string]groupRecord),
	}
	b.reapRemains()
	return b, nil
}

// Name is "exec".
func (b *Backend) Name() string { return string(supervisor.KindExec) }

// LogPath is the file that holds model's engine output; rotated copies are
// LogPath+".1" (newest) up to LogPath+".<keep>".
func (b *Backend) LogPath(model string) string {
	return filepath.Join(b.logDir, logName(model))
}

// logName keeps a model name from escaping the log directory.
func logName(model string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, model) + ".log"
}

// Tail returns the last n lines of model's engine output, reaching back
// into rotated logs when the current one holds fewer.
func (b *Backend) Tail(model string, n int) ([]string, error) {
	var lines []string
	path := b.LogPath(model)
	for i := 0; i <= b.opts.LogKeep && len(lines) < n; i++ {
		p := path
		if i > 0 {
			p += "." + strconv.Itoa(i)
		}
		older, err := tailLines(p, n-len(lines))
		if errors.Is(err, fs.ErrNotExist) && i > 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("tail log of %s: %w", model, err)
		}
		lines = append(older, lines...)
	}
	return lines, nil
}

// Logs implements supervisor.LogReader: the engine's captured output.
func (b *Backend) Logs(spec supervisor.Spec, lines int) ([]string, error) {
	return b.Tail(spec.Model, lines)
}

// Start starts spec.Command in a new process group and returns once it is
// started; an engine already running is left alone. The engine gets
// SIGKILL should napd die (Pdeathsig), so it never outlives napd.
func (b *Backend) Start(ctx context.Context, spec supervisor.Spec) error {
	if len(spec.Command) == 0 {
		return fmt.Errorf("start %s: the exec backend needs a command (unit %q needs systemd)", spec.Model, spec.Unit)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start %s: %w", spec.Model, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("start %s: exec backend closed", spec.Model)
	}
	if e := b.engines[spec.Model]; e != nil && e.state == supervisor.ProcRunning {
		return nil
	}
	e, err := b.spawn(spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.Model, err)
	}
	b.engines[spec.Model] = e
	b.log.Info("engine started", "model", spec.Model, "pid", e.pid, "log", b.LogPath(spec.Model))
	b.emit(supervisor.Event{Model: spec.Model, State: supervisor.ProcRunning, Reason: "started", Time: time.Now()})
	return nil
}

// spawn starts the process and its output copier and waiter; b.mu is held.
func (b *Backend) spawn(spec supervisor.Spec) (*engine, error) {
	cred, err := credential(spec.User)
	if err != nil {
		return nil, err
	}
	out := b.logs[spec.Model]
	if out == nil {
		if out, err = openLog(b.LogPath(spec.Model), b.opts.LogMaxBytes, b.opts.LogKeep); err != nil {
			return nil, err
		}
		b.logs[spec.Model] = out
	}
	// Our own pipe, not cmd's: Wait then returns when the leader exits even
	// while a grandchild still holds the write end.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	growPipe(pw)
	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Env = environ(os.Environ(), spec)
	cmd.Dir = spec.WorkingDirectory
	cmd.Stdout, cmd.Stderr = pw, pw
	// Pdeathsig fires when the OS thread that forked dies; Go keeps its
	// threads for the life of the process (none here is locked and left),
	// so in practice it fires when napd dies, even by SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
		Credential: cred,
	}
	fmt.Fprintf(out, "--- napd: starting %s\n", strings.Join(spec.Command, " "))
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, err
	}
	e := &engine{pid: cmd.Process.Pid, done: make(chan struct{}), stopTimeout: spec.StopTimeout, state: supervisor.ProcRunning}
	// Recorded before anything else can happen to the group; a leader
	// already gone (no record) is reaped with its group by wait.
	if r, err := b.fs.record(e.pid); err == nil {
		b.groups[spec.Model] = r
		b.saveGroups()
	}
	copied, exited := make(chan struct{}), make(chan struct{})
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		defer close(copied)
		copyOutput(out, pr, exited)
		pr.Close()
	}()
	go b.wait(spec.Model, cmd, e, pr, exited, copied)
	return e, nil
}

// outputBatch is how long the output copier lets an engine's lines gather
// in its pipe after a read that emptied it.
const outputBatch = 50 * time.Millisecond

// copyOutput copies an engine's output to its log until the pipe ends.
// Engines write a line at a time (llama-server about ten per request):
// reading each as it came woke napd as often, about 100 µs of napd's CPU
// and seven thread switches per request behind llama-server. After a read
// that emptied the pipe it waits outputBatch, so the lines written
// meanwhile are read and logged in one go; once exited is closed (the
// engine's group is gone) it waits no more, so that a stop is not held up
// by the batching.
func copyOutput(out io.Writer, pr *os.File, exited <-chan struct{}) {
	buf := make([]byte, 64<<10)
	batch := time.NewTimer(outputBatch)
	defer batch.Stop()
	for {
		n, err := pr.Read(buf)
		if n > 0 {
			_, _ = out.Write(buf[:n])
		}
		if err != nil {
			return
		}
		if n < len(buf) {
			batch.Reset(outputBatch)
			select {
			case <-exited:
			case <-batch.C:
			}
		}
	}
}

// growPipe asks for a 1 MiB pipe buffer (Linux's default is 64 KiB), so an
// engine that logs fast does not wait on a copier that batches its lines.
// Where the kernel refuses (pipe-max-size), the pipe stays as it is.
func growPipe(pw *os.File) {
	if rc, err := pw.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
	}
}

// wait reaps the leader, kills what is left of its group (an engine's
// workers must not outlive it), records the exit and reports it.
func (b *Backend) wait(model string, cmd *exec.Cmd, e *engine, pr *os.File, exited chan<- struct{}, copied <-chan struct{}) {
	defer b.wg.Done()
	_ = cmd.Wait()
	at := time.Now()
	reason := "exit status unknown"
	if cmd.ProcessState != nil {
		reason = cmd.ProcessState.String()
	}
	_ = syscall.Kill(-e.pid, syscall.SIGKILL)
	b.awaitGone(func() []int { return b.fs.groupPIDs(e.pid) }, "pgid", e.pid)
	close(exited)
	_ = pr.SetReadDeadline(time.Now().Add(outputGrace))
	<-copied

	b.mu.Lock()
	if r, ok := b.groups[model]; ok && r.PGID == e.pid {
		delete(b.groups, model)
		b.saveGroups()
	}
	state := supervisor.ProcFailed
	if e.stopping {
		state = supervisor.ProcStopped
	}
	e.state, e.reason = state, reason
	if out := b.logs[model]; out != nil {
		fmt.Fprintf(out, "--- napd: engine %s: %s\n", state, reason)
	}
	b.mu.Unlock()
	// Logged before Stop's caller hears of it (done), so that the log
	// shows the exit before whatever the caller does next (a wake that
	// took its GPU memory).
	if state == supervisor.ProcFailed {
		b.log.Warn("engine exited", "model", model, "pid", e.pid, "status", reason)
	} else {
		b.log.Info("engine stopped", "model", model, "pid", e.pid, "status", reason)
	}
	close(e.done)
	b.emit(supervisor.Event{Model: model, State: state, Reason: reason, Time: at})
}

// awaitGone waits, bounded, until live lists no process after they were
// sent SIGKILL. The kernel gives no event for that, so it looks.
func (b *Backend) awaitGone(live func() []int, attrs ...any) {
	deadline := time.Now().Add(groupGoneWait)
	for len(live()) > 0 {
		if time.Now().After(deadline) {
			b.log.Warn("engine processes survive SIGKILL", append(attrs, "pids", live())...)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// emit delivers ev; only once the backend is closing and the buffer is full
// is it dropped.
func (b *Backend) emit(ev supervisor.Event) { supervisor.Send(b.events, b.quit, ev) }

// Stop sends SIGTERM to the engine's group, SIGKILL after spec.StopTimeout
// (or at once when ctx ends), and returns once the leader is reaped and the
// group is gone. Stopping an engine that does not run is a no-op.
func (b *Backend) Stop(ctx context.Context, spec supervisor.Spec) error {
	b.mu.Lock()
	e := b.engines[spec.Model]
	if e == nil || e.state != supervisor.ProcRunning {
		b.mu.Unlock()
		return nil
	}
	e.stopping = true
	b.mu.Unlock()
	b.terminate(ctx, spec.Model, e, spec.StopTimeout)
	return nil
}

func (b *Backend) terminate(ctx context.Context, model string, e *engine, timeout time.Duration) {
	if timeout <= 0 {
		timeout = DefaultStopTimeout
	}
	_ = syscall.Kill(-e.pid, syscall.SIGTERM)
	// A stopped engine (SIGSTOP, a debugger) handles SIGTERM only once it
	// runs again, as systemd does it.
	_ = syscall.Kill(-e.pid, syscall.SIGCONT)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.done:
		return
	case <-t.C:
		b.log.Warn("engine ignored SIGTERM, killing it", "model", model, "pid", e.pid, "stop_timeout", timeout)
	case <-ctx.Done():
		b.log.Warn("stop cancelled, killing engine", "model", model, "pid", e.pid, "err", context.Cause(ctx))
	}
	_ = syscall.Kill(-e.pid, syscall.SIGKILL)
	<-e.done
}

// Status reports the engine's state; for a running engine also its PIDs and
// memory, with Reason naming where the memory figure comes from.
func (b *Backend) Status(ctx context.Context, spec supervisor.Spec) (supervisor.Status, error) {
	b.mu.Lock()
	e := b.engines[spec.Model]
	var state supervisor.ProcState
	var reason string
	if e != nil {
		state, reason = e.state, e.reason
	}
	b.mu.Unlock()
	if e == nil {
		return supervisor.Status{State: supervisor.ProcStopped}, nil
	}
	if state != supervisor.ProcRunning {
		return supervisor.Status{State: state, Reason: reason}, nil
	}
	st := supervisor.Status{State: state, PIDs: b.fs.groupPIDs(e.pid)}
	if mem, source, err := b.fs.memory(e.pid, st.PIDs); err == nil {
		st.MemoryBytes, st.HaveMemory, st.Reason = mem, true, source
	}
	return st, nil
}

// Running lists the models whose engines run, sorted.
func (b *Backend) Running(ctx context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var models []string
	for m, e := range b.engines {
		if e.state == supervisor.ProcRunning {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	return models, nil
}

// Events streams process state changes; it is closed by Close. Events not
// read by the time Close returns are dropped.
func (b *Backend) Events() <-chan supervisor.Event { return b.events }

// Close stops every engine (SIGTERM, SIGKILL after its stop timeout), waits
// until all are reaped, and closes the logs and the event stream. Later
// calls do nothing.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() { err = b.close() })
	return err
}

func (b *Backend) close() error {
	// First, so a Start blocked on a full event buffer lets go of b.mu.
	close(b.quit)
	b.mu.Lock()
	b.closed = true
	running := make(map[string]*engine)
	for m, e := range b.engines {
		if e.state == supervisor.ProcRunning {
			e.stopping = true
			running[m] = e
		}
	}
	b.mu.Unlock()

	var stops sync.WaitGroup
	for m, e := range running {
		stops.Go(func() { b.terminate(context.Background(), m, e, e.stopTimeout) })
	}
	stops.Wait()
	b.wg.Wait()
	close(b.events)

	var errs []error
	for _, l := range b.logs {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// The exec backend's optional calls.
var _ supervisor.LogReader = (*Backend)(nil)
