// Command napctl controls a running napd over its control socket.
//
// It owns the command line only: every command is one control API call
// (agent/control's client), but config check and show, which read the
// config files, and import, which converts another proxy's configuration
// (agent/config/llamaswap). It must not read napd's state files or touch
// engines itself.
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

	"github.com/BurntSushi/toml"

	"github.com/napd/napd/agent/config"
)

const usage = `usage: napctl [--socket PATH] [--config FILE] COMMAND [ARGS]

Commands:
  status [--json]               every model: state, leases, queue, memory
  wake MODEL                    wake a model and wait until it serves
  sleep MODEL [--strategy S]    put a model to sleep (S: stop, vllm-l1, vllm-l2, sglang)
  reset MODEL                   clear a failed model so it can be woken again
  logs MODEL [-n N]             the engine's last output lines (exec supervisor)
  events [-f]                   print state changes (-f: keep following)
  usage [--since 24h] [--json]  GPU time, wakes, swaps and tokens per key and model,
                                and the day's use of keys with a quota
  reload                        re-read napd's config file (like systemctl reload napd)
  config check [FILE]           validate a config file and its drop-ins (default: --config)
  config show [MODEL]           the effective configuration (after templates and
                                drop-ins), each value with the file:line it came from
  import llama-swap FILE [--out DIR] [--keys FILE]
                                convert a llama-swap config to napd's (docs/migrating.md)

The socket is --socket, else $NAPD_SOCKET, else agent.control_socket of the
config file, else /run/napd/control.sock.
`

const defaultConfig = "/etc/napd/napd.toml"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var ue usageError
	switch {
	case err == nil:
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "napctl: %v\n\n%s", err, usage)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "napctl: %v\n", err)
		os.Exit(1)
	}
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// cli is one invocation.
type cli struct {
	socket string
	config string
	out    io.Writer
	errOut io.Writer
}

func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("napctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := &cli{out: out, errOut: errOut}
	fs.StringVar(&c.socket, "socket", "", "control socket `path`")
	fs.StringVar(&c.config, "config", defaultConfig, "napd config `file`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(out, usage)
			return nil
		}
		return usageError{err.Error()}
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usageError{"no command"}
	}
	err := c.dispatch(ctx, rest[0], rest[1:])
	if errors.Is(err, errHelped) {
		return nil
	}
	return err
}

func (c *cli) dispatch(ctx context.Context, cmd string, rest []string) error {
	switch cmd {
	case "status":
		return c.status(ctx, rest)
	case "wake":
		return c.wake(ctx, rest)
	case "sleep":
		return c.sleep(ctx, rest)
	case "reset":
		return c.reset(ctx, rest)
	case "logs":
		return c.logs(ctx, rest)
	case "events":
		return c.events(ctx, rest)
	case "reload":
		return c.reload(ctx, rest)
	case "usage":
		return c.usage(ctx, rest)
	case "config":
		return c.configCmd(rest)
	case "import":
		return c.importCmd(rest)
	case "help":
		fmt.Fprint(c.out, usage)
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q", cmd)}
}

// socketPath finds the control socket (see usage).
func (c *cli) socketPath() string {
	if c.socket != "" {
		return c.socket
	}
	if s := os.Getenv("NAPD_SOCKET"); s != "" {
		return s
	}
	if cfg, err := config.Load(c.config); err == nil && cfg.Agent.ControlSocket != "" {
		return cfg.Agent.ControlSocket
	}
	// A config with a mistake elsewhere (being edited before a reload)
	// still names the socket of the napd that runs on its previous version.
	var partial struct {
		Agent struct {
			ControlSocket string `toml:"control_socket"`
		} `toml:"agent"`
	}
	if _, err := toml.DecodeFile(c.config, &partial); err == nil && partial.Agent.ControlSocket != "" {
		return partial.Agent.ControlSocket
	}
	return "/run/napd/control.sock"
}

// subFlags parses a subcommand's flags, before or after its arguments (the
// usage lines read "sleep MODEL [--strategy S]"); help prints the
// subcommand's usage.
func (c *cli) subFlags(name, synopsis string, args []string, define func(*flag.FlagSet)) ([]string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if define != nil {
		define(fs)
	}
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(c.out, "usage: napctl %s\n", synopsis)
				fs.SetOutput(c.out)
				fs.PrintDefaults()
				return nil, errHelped
			}
			return nil, usageError{fmt.Sprintf("%s: %v", name, err)}
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, nil
		}
		rest, args = append(rest, args[0]), args[1:]
	}
}

// errHelped ends a command after its --help was printed.
var errHelped = errors.New("help printed")

// oneModel checks that exactly one MODEL argument was given.
func oneModel(name string, args []string) (string, error) {
	if len(args) != 1 {
		return "", usageError{fmt.Sprintf("%s: want exactly one MODEL", name)}
	}
	return args[0], nil
}
