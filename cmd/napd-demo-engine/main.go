// Command napd-demo-engine emulates a vLLM OpenAI-compatible server without
// a GPU, so that napd can be developed, demonstrated and tested end to end.
// See docs/demo-engine.md.
//
// It owns the flags only; the emulation is internal/demoengine. It is a test
// and demo tool and must not be needed by napd itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/internal/demoengine"
)

// shutdownTimeout bounds the graceful exit after SIGTERM or SIGINT.
const shutdownTimeout = 5 * time.Second

// errFailStart is --fail-start's failure; it exits with status 1.
var errFailStart = errors.New("failing start as configured (--fail-start)")

func main() {
	err := run(os.Args[1:], os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		// -h printed the usage; asking for help is not a failure.
	default:
		fmt.Fprintln(os.Stderr, "napd-demo-engine:", err)
		code := 1
		if _, ok := errors.AsType[usageError](err); ok {
			code = 2
		}
		os.Exit(code)
	}
}

// usageError is a bad command line (exit status 2).
type usageError struct{ error }

// cmdline is the parsed command line.
type cmdline struct {
	host          string
	port          int
	failStart     bool
	ignoreSIGTERM bool
	opts          demoengine.Options
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// sizeFlag is a byte size flag ("512MiB").
type sizeFlag struct{ n *int64 }

func (f sizeFlag) String() string {
	if f.n == nil {
		return "0"
	}
	return strconv.FormatInt(*f.n, 10)
}

func (f sizeFlag) Set(v string) error {
	n, err := config.ParseSize(v)
	if err != nil {
		return err
	}
	*f.n = n
	return nil
}

func parseFlags(args []string, stderr *os.File) (cmdline, error) {
	var c cmdline
	fs := flag.NewFlagSet("napd-demo-engine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var models stringList
	fs.StringVar(&c.host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&c.port, "port", 8000, "port to listen on (0 picks a free one; the log names it)")
	fs.Var(&models, "model", "served model name (repeatable; default \"demo\")")
	fs.DurationVar(&c.opts.StartupDelay, "startup-delay", 0, "time spent loading before /health turns 200")
	loadFile := fs.String("load-file", "", "file read whole at start before /health turns 200, as an engine reads its weights (a directory: every regular file in it)")
	fs.Var(sizeFlag{&c.opts.LoadRate}, "load-rate", "pace of the --load-file read in bytes per second, e.g. 200MiB (0 = as fast as the disk)")
	fs.DurationVar(&c.opts.TTFT, "ttft", 100*time.Millisecond, "time to the first token")
	fs.Float64Var(&c.opts.TokensPerSecond, "tokens-per-second", 50, "pace of the tokens after the first (0 = no delay)")
	fs.BoolVar(&c.opts.SleepMode, "sleep-mode", false, "serve vLLM's sleep endpoints and SGLang's memory-occupation ones")
	fs.DurationVar(&c.opts.WakeDelay, "wake-delay", 0, "time a wake_up takes")
	fs.Var(sizeFlag{&c.opts.MemoryBytes}, "memory", "resident memory held as weights, e.g. 512MiB (sizes as in napd.toml)")
	fs.IntVar(&c.opts.MaxNumSeqs, "max-num-seqs", 256, "completions running at once; more wait")
	fs.BoolVar(&c.failStart, "fail-start", false, "exit with status 1 after the startup delay")
	fs.StringVar(&c.opts.Flavor, "flavor", demoengine.FlavorVLLM, "engine whose metric and status endpoints are served: "+strings.Join(demoengine.Flavors, ", "))
	fs.BoolVar(&c.opts.Metrics, "metrics", false, "llamacpp flavor: serve /metrics (llama.cpp's --metrics; else 501)")
	fs.Func("sleep-idle-seconds", "llama.cpp's own idle sleep: free the weights after N seconds without a task, reload on the next (-1 = never)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 || n < -1 {
			return fmt.Errorf("invalid value %q: cannot be 0 or less than -1", v)
		}
		c.opts.SleepIdle = max(time.Duration(n)*time.Second, 0)
		return nil
	})
	fs.BoolVar(&c.opts.HangHealth, "hang-health", false, "never answer /health")
	fs.BoolVar(&c.opts.BusyHealth, "busy-health", false, "do not answer /health while a completion runs")
	fs.IntVar(&c.opts.CrashAfter, "crash-after", 0, "exit with status 3 on the Nth completion (mid-stream if streamed); 0 = never")
	fs.BoolVar(&c.ignoreSIGTERM, "ignore-sigterm", false, "ignore SIGTERM, so that only SIGKILL stops the engine")
	policy := fs.String("scheduling-policy", "fcfs", "vLLM's: \"priority\" accepts a completion's priority field (counted in /debug/stats), \"fcfs\" refuses a non-zero one")
	// vLLM's flag, accepted so that napd's first-load estimate can be
	// tried with a command line as vLLM's; there is no GPU to take.
	fs.Float64("gpu-memory-utilization", 0.9, "accepted as vLLM's, ignored (no GPU)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, usageError{err}
	}
	if fs.NArg() > 0 {
		return c, usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	switch *policy {
	case "fcfs":
	case "priority":
		c.opts.PriorityScheduling = true
	default:
		return c, usageError{fmt.Errorf("unknown --scheduling-policy %q (want fcfs or priority)", *policy)}
	}
	if !slices.Contains(demoengine.Flavors, c.opts.Flavor) {
		return c, usageError{fmt.Errorf("unknown --flavor %q (want %s)", c.opts.Flavor, strings.Join(demoengine.Flavors, ", "))}
	}
	if *loadFile != "" {
		files, err := demoengine.LoadPaths(*loadFile)
		if err != nil {
			return c, usageError{fmt.Errorf("--load-file: %w", err)}
		}
		c.opts.LoadFiles = files
	}
	c.opts.Models = models
	return c, nil
}

func run(args []string, stderr *os.File) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	c.opts.Logger = log

	signals := []os.Signal{os.Interrupt}
	if c.ignoreSIGTERM {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signals = append(signals, syscall.SIGTERM)
	}
	ctx, stop := signal.NotifyContext(context.Background(), signals...)
	defer stop()

	var failStart <-chan time.Time
	if c.failStart {
		failStart = time.After(c.opts.StartupDelay)
		// It never loads: /health must not answer 200 in the instant
		// between the end of the delay and the exit.
		c.opts.StartupDelay = 100 * 365 * 24 * time.Hour
	}
	if c.opts.Flavor == demoengine.FlavorTGI && !c.failStart {
		// TGI's router listens only once every shard is loaded: until
		// then connections are refused.
		select {
		case <-time.After(c.opts.StartupDelay):
		case <-ctx.Done():
			return nil
		}
		c.opts.StartupDelay = 0
	}
	engine := demoengine.New(c.opts)
	ln, err := net.Listen("tcp", net.JoinHostPort(c.host, strconv.Itoa(c.port)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           engine.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		// Every request sees shutdown, so open streams end at once.
		BaseContext: func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				engine.CountConnection()
			}
		},
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "flavor", c.opts.Flavor, "models", engine.Models(), "sleep_mode", c.opts.SleepMode)

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-failStart:
		return errFailStart
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
