// Command napd is the per-host agent for GPU inference boxes: it supervises
// inference engines, puts idle models to sleep and serves the local
// OpenAI-compatible gateway.
//
// It owns the flags, --check and the signals; everything else is agent.Run.
// It must not grow logic of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/napd/napd/agent"
	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/warmweights"
	"github.com/napd/napd/supervisor/backend"
)

// version is set at build time (-ldflags "-X main.version=…").
var version = "dev"

// options are napd's command-line flags.
type options struct {
	configPath string
	check      bool
	version    bool
}

// errCheckFailed is returned after the problems were already printed.
var errCheckFailed = errors.New("config check failed")

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2)
	}
	if err := run(opts, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, errCheckFailed) {
			fmt.Fprintln(os.Stderr, "napd:", err)
		}
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("napd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configPath, "config", config.DefaultPath, "configuration `file`")
	fs.BoolVar(&o.check, "check", false, "validate the configuration, print the result and exit")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "napd: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return o, errors.New("unexpected arguments")
	}
	return o, nil
}

func run(o options, stdout, stderr io.Writer) error {
	if o.version {
		fmt.Fprintln(stdout, "napd", version)
		return nil
	}
	cfg, err := config.Load(o.configPath)
	if err == nil && o.check {
		// What the start would refuse beyond the file: keys, directories.
		err = agent.Check(cfg)
	}
	if err != nil {
		var problems config.Errors
		if errors.As(err, &problems) {
			// One problem per line, FILE:LINE: KEY: message, for editors
			// and for systemd's ExecStartPre output in the journal.
			fmt.Fprintln(stderr, problems.Error())
			return errCheckFailed
		}
		return err
	}
	if o.check {
		// Warnings (deprecated keys) do not fail the check: napd starts.
		for _, w := range cfg.Warnings {
			fmt.Fprintln(stderr, w.String())
		}
		fmt.Fprintf(stdout, "%s: ok (%s)\n", o.configPath, cfg.Summary())
		for _, note := range append(cfg.CheckNotes(), warmweights.Notes(cfg)...) {
			fmt.Fprintln(stdout, note)
		}
		return nil
	}
	// SIGTERM/SIGINT end the daemon gracefully; SIGHUP (reload) is the
	// agent's own.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return agent.Run(ctx, agent.Options{ConfigPath: o.configPath, Version: version, Stderr: stderr, OpenBackend: backend.Open})
}
