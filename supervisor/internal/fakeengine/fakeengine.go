// Package fakeengine turns a test binary into a tiny fake inference engine,
// the way os/exec's own tests use their binary as a helper process: TestMain
// calls MaybeRun first, and a test starts os.Args[0] with the Env* variables
// set. It serves /health after a delay, exits with a status, ignores SIGTERM
// or leaves a grandchild behind, so the supervisor is tested against real
// processes without a separate build.
//
// It is for tests only: production code must not import it.
package fakeengine

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Environment variables that configure the fake engine.
const (
	// EnvMode selects the role: "engine" or "grandchild". Unset: not a helper.
	EnvMode = "NAPD_FAKE_ENGINE"
	// EnvPort is the loopback port to serve on; unset serves nothing.
	EnvPort = "FAKE_PORT"
	// EnvReadyAfter delays a 200 from /health (503 before), e.g. "300ms".
	EnvReadyAfter = "FAKE_READY_AFTER"
	// EnvHangHealth makes /health never answer.
	EnvHangHealth = "FAKE_HANG_HEALTH"
	// EnvExitAfter exits after this duration with EnvExitCode.
	EnvExitAfter = "FAKE_EXIT_AFTER"
	// EnvExitCode is the exit status for EnvExitAfter (default 0).
	EnvExitCode = "FAKE_EXIT_CODE"
	// EnvIgnoreTerm ignores SIGTERM, so only SIGKILL ends the engine.
	EnvIgnoreTerm = "FAKE_IGNORE_TERM"
	// EnvGrandchildPIDFile starts a grandchild that ignores SIGTERM and
	// writes its PID to this file.
	EnvGrandchildPIDFile = "FAKE_GRANDCHILD_PIDFILE"
	// EnvSpewBytes writes about this many bytes of output lines at start.
	EnvSpewBytes = "FAKE_SPEW_BYTES"
	// EnvPrintEnv prints the named variables, one "NAME=value" line each
	// (comma-separated names), to stdout at start.
	EnvPrintEnv = "FAKE_PRINT_ENV"
)

// Env is the environment of a fake engine configured by vars (Env*
// names). It also turns off the race detector's one-second pause at exit, so
// an exit under `go test -race` is as quick as without.
func Env(vars map[string]string) map[string]string {
	env := map[string]string{EnvMode: "engine", "GORACE": "atexit_sleep_ms=0"}
	for k, v := range vars {
		env[k] = v
	}
	return env
}

// MaybeRun runs the fake engine and exits when EnvMode asks for it; it
// returns at once otherwise.
func MaybeRun() {
	switch os.Getenv(EnvMode) {
	case "":
		return
	case "grandchild":
		signal.Ignore(syscall.SIGTERM)
		select {}
	default:
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "fake engine:", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
}

func run() error {
	start := time.Now()
	fmt.Fprintln(os.Stderr, "fake engine starting, pid", os.Getpid())
	if os.Getenv(EnvIgnoreTerm) != "" {
		signal.Ignore(syscall.SIGTERM)
	}
	for _, name := range strings.Split(os.Getenv(EnvPrintEnv), ",") {
		if name != "" {
			v, ok := os.LookupEnv(name)
			fmt.Printf("%s=%s (set=%t)\n", name, v, ok)
		}
	}
	if n, _ := strconv.Atoi(os.Getenv(EnvSpewBytes)); n > 0 {
		line := strings.Repeat("x", 99) + "\n"
		for written := 0; written < n; written += len(line) {
			fmt.Print(line)
		}
	}
	if path := os.Getenv(EnvGrandchildPIDFile); path != "" {
		if err := spawnGrandchild(path); err != nil {
			return err
		}
	}
	if d := os.Getenv(EnvExitAfter); d != "" {
		after, err := time.ParseDuration(d)
		if err != nil {
			return err
		}
		code, _ := strconv.Atoi(os.Getenv(EnvExitCode))
		time.AfterFunc(after, func() { os.Exit(code) })
	}
	if port := os.Getenv(EnvPort); port != "" {
		return serve(port, start)
	}
	select {}
}

func spawnGrandchild(pidFile string) error {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), EnvMode+"=grandchild")
	if err := cmd.Start(); err != nil {
		return err
	}
	return os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

func serve(port string, start time.Time) error {
	readyAfter, err := time.ParseDuration(orDefault(os.Getenv(EnvReadyAfter), "0s"))
	if err != nil {
		return err
	}
	hang := os.Getenv(EnvHangHealth) != ""
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if hang {
			<-r.Context().Done()
			return
		}
		if time.Since(start) < readyAfter {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		return err
	}
	return http.Serve(ln, mux)
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
