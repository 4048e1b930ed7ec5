package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Error is a runtime command that failed, with the runtime's own message
// (its stderr), e.g. `podman create: Error: localhost/x: image not known`.
type Error struct {
	Runtime string // "podman" or "docker"
	Op      string // "create", "start", …
	Message string
}

func (e *Error) Error() string { return e.Runtime + " " + e.Op + ": " + e.Message }

// notFound reports whether err is the runtime saying the container does
// not exist.
func notFound(err error) bool {
	var re *Error
	if !errors.As(err, &re) {
		return false
	}
	m := strings.ToLower(re.Message)
	return strings.Contains(m, "no such container") || strings.Contains(m, "no such object")
}

// Bounds on what napd reads of a runtime command: its answer, and its
// error message.
const (
	maxOutput  = maxInspect
	maxMessage = 512
)

// callTimeout bounds one runtime command that has no deadline of its own
// (a list, an inspect, a removal).
const callTimeout = 30 * time.Second

// client runs one runtime's commands.
type client struct {
	kind    string   // Podman or Docker
	program string   // its executable
	environ []string // napd's environment, which the client inherits
}

// run runs the runtime with args and returns what it printed on stdout.
// extra is added to the client's environment (the container's variables,
// which create passes by name). The command dies with napd (Pdeathsig) and
// with ctx.
func (c client) run(ctx context.Context, extra map[string]string, args ...string) ([]byte, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := c.command(ctx, extra, args...)
	cmd.Stdout = &limitedWriter{w: &stdout, n: maxOutput}
	cmd.Stderr = &limitedWriter{w: &stderr, n: maxOutput}
	if err := cmd.Run(); err != nil {
		msg := message(stderr.Bytes())
		if msg == "" {
			msg = err.Error()
		}
		if ctx.Err() != nil {
			msg = fmt.Sprintf("%s (%v)", msg, context.Cause(ctx))
		}
		return stdout.Bytes(), &Error{Runtime: c.kind, Op: args[0], Message: msg}
	}
	return stdout.Bytes(), nil
}

// command is the runtime's command line args, in napd's environment plus
// extra. It dies with napd (Pdeathsig) and with ctx.
func (c client) command(ctx context.Context, extra map[string]string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.program, args...)
	cmd.Env = c.environ
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// bounded is ctx with callTimeout unless it has a deadline of its own.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, callTimeout)
}

// message is the runtime's error message in its stderr: the lines that
// are not advice on --help, joined, bounded.
func message(stderr []byte) string {
	var lines []string
	for l := range strings.Lines(string(stderr)) {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "See '") || strings.HasPrefix(l, "Run '") {
			continue
		}
		lines = append(lines, l)
	}
	m := strings.Join(lines, "; ")
	if len(m) > maxMessage {
		m = m[:maxMessage] + "…"
	}
	return m
}

// limitedWriter keeps the first n bytes written and drops the rest, so a
// runaway command cannot grow napd's memory.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.n -= k
		_, _ = l.w.Write(p[:k])
	}
	return len(p), nil
}

// inspect inspects containers by name or ID. Those that do not exist are
// left out (a list names containers that may go before they are
// inspected); none of them existing is not an error.
func (c client) inspect(ctx context.Context, refs ...string) ([]inspected, error) {
	out, err := c.run(ctx, nil, append([]string{"container", "inspect"}, refs...)...)
	// With several references, the runtime prints the ones it found and
	// fails for the others.
	if err != nil && !(notFound(err) && bytes.HasPrefix(bytes.TrimSpace(out), []byte("["))) {
		if notFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return parseInspect(out)
}

// inspectOne inspects one container; nil when it does not exist.
func (c client) inspectOne(ctx context.Context, ref string) (*inspected, error) {
	found, err := c.inspect(ctx, ref)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	return &found[0], nil
}

// list inspects every container instance's napd created with this
// runtime, running or not.
func (c client) list(ctx context.Context, instance string) ([]inspected, error) {
	out, err := c.run(ctx, nil, "ps", "--all", "--quiet", "--no-trunc", "--filter", "label="+LabelInstance+"="+instance)
	if err != nil {
		return nil, err
	}
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		return nil, nil
	}
	return c.inspect(ctx, ids...)
}

// remove removes a container, stopping it at once if it runs; one that
// does not exist is removed already.
func (c client) remove(ctx context.Context, ref string) error {
	_, err := c.run(ctx, nil, "rm", "--force", ref)
	if notFound(err) {
		return nil
	}
	return err
}

// stop asks the container to stop (its stop signal, SIGKILL after grace
// seconds) and returns once it stopped.
func (c client) stop(ctx context.Context, ref, grace string) error {
	_, err := c.run(ctx, nil, "stop", "-t", grace, ref)
	if notFound(err) {
		return nil
	}
	return err
}

// stopLine is the command line of stop, for a unit's ExecStop=.
func (c client) stopLine(ref, grace string) []string {
	return []string{c.program, "stop", "-t", grace, ref}
}

// logs returns the last lines of the container's output, stdout and
// stderr as the runtime interleaves them (`logs` writes the container's
// stderr to its own).
func (c client) logs(ctx context.Context, ref string, lines int) ([]string, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var out bytes.Buffer
	w := &limitedWriter{w: &out, n: maxOutput}
	cmd := c.command(ctx, nil, "logs", "--tail", strconv.Itoa(lines), ref)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return nil, &Error{Runtime: c.kind, Op: "logs", Message: message(out.Bytes())}
	}
	var res []string
	for l := range strings.Lines(out.String()) {
		res = append(res, strings.TrimRight(l, "\r\n"))
	}
	if len(res) > lines {
		res = res[len(res)-lines:]
	}
	return res, nil
}
