package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
)

func writeConfig(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "napd.toml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRun_CheckOK(t *testing.T) {
	path := writeConfig(t, "[models.a]\ncommand = [\"e\", \"${PORT}\"]\n")
	var stdout, stderr bytes.Buffer
	if err := run(options{configPath: path, check: true}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v", err)
	}
	if got, want := stdout.String(), path+": ok (1 models)\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr = %q", stderr.String())
	}
}

// napd --check names the container runtime it found for the models with
// an image, and fails when there is none.
func TestRun_CheckNamesTheContainerRuntime(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	path := writeConfig(t, "[models.a]\nimage = \"vllm/vllm-openai:v0.11.0\"\ncommand = [\"--port\", \"${PORT}\"]\n")
	var stdout, stderr bytes.Buffer
	if err := run(options{configPath: path, check: true}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if want := "container runtime docker (" + filepath.Join(dir, "docker") + ") for a\n"; !strings.HasSuffix(stdout.String(), want) {
		t.Errorf("stdout = %q, want it to end with %q", stdout.String(), want)
	}
	t.Setenv("PATH", t.TempDir())
	stdout.Reset()
	if err := run(options{configPath: path, check: true}, &stdout, &stderr); !errors.Is(err, errCheckFailed) ||
		!strings.Contains(stderr.String(), path+":2: models.a.image: a container needs podman or docker") {
		t.Errorf("no runtime on PATH: %v, stderr %q", err, stderr.String())
	}
}

// A deprecated key does not fail the check: its warning names file, line
// and key and says what to do instead, on stderr; stdout says ok.
func TestRun_CheckWarnsOfDeprecatedKeys(t *testing.T) {
	path := writeConfig(t, "[agent]\nheap_floor = \"32MiB\"\ncpus = 2\n\n[models.a]\ncommand = [\"e\", \"${PORT}\"]\n")
	var stdout, stderr bytes.Buffer
	if err := run(options{configPath: path, check: true}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v", err)
	}
	if got, want := stdout.String(), path+": ok (1 models)\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	want := []string{path + ":2: agent.heap_floor: deprecated and ignored: ", path + ":3: agent.cpus: deprecated and ignored: "}
	if len(lines) != len(want) {
		t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(want), stderr.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) || !strings.Contains(lines[i], "Environment=GO") {
			t.Errorf("line %d = %q, want %q… and what to set instead", i, lines[i], w)
		}
	}
}

func TestRun_CheckPrintsEveryProblem(t *testing.T) {
	path := writeConfig(t, "[agent]\nsupervisor = \"k8s\"\n\n[models.a]\nsleep = \"x\"\n")
	var stdout, stderr bytes.Buffer
	err := run(options{configPath: path, check: true}, &stdout, &stderr)
	if !errors.Is(err, errCheckFailed) {
		t.Fatalf("run error = %v, want errCheckFailed", err)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	want := []string{
		path + ":2: agent.supervisor: ",
		path + ":4: models.a: neither command nor unit",
		path + ":5: models.a.sleep: ",
	}
	if len(lines) != len(want) {
		t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(want), stderr.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], w)
		}
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q", stdout.String())
	}
}

func TestRun_MissingFile(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(options{configPath: filepath.Join(t.TempDir(), "none.toml"), check: true}, &stdout, &stderr)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want ErrNotExist", err)
	}
}

func TestRun_Version(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(options{version: true, configPath: "/nonexistent"}, &stdout, &stdout); err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); got != "napd "+version+"\n" {
		t.Errorf("stdout = %q", got)
	}
}

func TestParseFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"--config", "x.toml", "--check"}, &stderr)
	if err != nil || o != (options{configPath: "x.toml", check: true}) {
		t.Errorf("got %+v, %v", o, err)
	}
	o, err = parseFlags(nil, &stderr)
	if err != nil || o.configPath != "/etc/napd/napd.toml" {
		t.Errorf("default: got %+v, %v", o, err)
	}
	if _, err := parseFlags([]string{"--check", "extra"}, &stderr); err == nil {
		t.Error("extra argument accepted")
	}
	if _, err := parseFlags([]string{"--nope"}, &stderr); err == nil {
		t.Error("unknown flag accepted")
	}
}

// TestRun_CheckFailsWhereTheStartWould: every case makes the daemon's start
// fail, so --check must fail too, naming the key and the cause, and return.
func TestRun_CheckFailsWhereTheStartWould(t *testing.T) {
	dir := t.TempDir()
	model := "[models.a]\ncommand = [\"e\", \"${PORT}\"]\n"
	malformed := filepath.Join(dir, "keys-malformed")
	if err := os.WriteFile(malformed, []byte("alice sk-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, bytes.Repeat([]byte("# padding\n"), config.MaxFileSize/10+1), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, config, want string
	}{
		{"api_keys_file missing", writeConfig(t, "[gateway]\napi_keys_file = \""+filepath.Join(dir, "nope")+"\"\n"+model), "gateway.api_keys_file: api keys: open"},
		{"api_keys_file malformed", writeConfig(t, "[gateway]\napi_keys_file = \""+malformed+"\"\n"+model), "gateway.api_keys_file: " + malformed + ":1: want \"name:key\""},
		{"api_keys_file a directory", writeConfig(t, "[gateway]\napi_keys_file = \""+dir+"\"\n"+model), "not a regular file but a directory"},
		{"gateway on the metrics address", writeConfig(t, "[agent]\nmetrics_listen = \"127.0.0.1:9100\"\n[gateway]\nlisten = [\"127.0.0.1:9100\"]\n"), "agent.metrics_listen: 127.0.0.1:9100 collides with gateway.listen"},
		{"localhost beside 127.0.0.1", writeConfig(t, "[gateway]\nlisten = [\"127.0.0.1:8080\", \"localhost:8080\"]\n"), "gateway.listen: localhost:8080 collides with gateway.listen 127.0.0.1:8080"},
		{"model port on the gateway", writeConfig(t, "[models.a]\ncommand = [\"e\"]\nport = 8080\n"), "models.a.port: port 8080 is napd's own"},
		{"control socket path too long", writeConfig(t, "[agent]\ncontrol_socket = \"/run/"+strings.Repeat("n", 110)+".sock\"\n"), "agent.control_socket: "},
		{"config is a device", "/dev/zero", "not a regular file but a character device"},
		{"config is a FIFO", fifo, "not a regular file but a named pipe"},
		{"config too large", big, "more than"},
	}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(dir, "foreign-state")
		if err := os.Mkdir(foreign, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 65534, -1); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ name, config, want string }{"state_dir owned by another user",
			writeConfig(t, "[agent]\nstate_dir = \""+foreign+"\"\n"), "agent.state_dir: " + foreign + ": owner uid 65534, mode -rwxr-xr-x"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			done := make(chan error, 1)
			go func() { done <- run(options{configPath: c.config, check: true}, &stdout, &stderr) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("napd --check did not return")
			}
			msg := stderr.String()
			if err != nil && !errors.Is(err, errCheckFailed) {
				msg += err.Error()
			}
			if err == nil || !strings.Contains(msg, c.want) {
				t.Errorf("--check = %v, output %q; want a failure saying %q", err, msg, c.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q", stdout.String())
			}
		})
	}
}

// The daemon itself refuses a state_dir another user owns, before it
// starts anything, naming the path, the owner and the mode.
func TestRun_StartRefusesAForeignStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory away")
	}
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, 65534, -1); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, "[agent]\nstate_dir = \""+state+"\"\nsupervisor = \"exec\"\n")
	var stdout, stderr bytes.Buffer
	err := run(options{configPath: path}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), state+": owner uid 65534, mode -rwxr-xr-x") {
		t.Fatalf("start with a foreign state_dir: %v", err)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("napd wrote into the foreign state_dir: %v", entries)
	}
}

// napd --check says per model which weight files it would keep warm.
func TestRun_CheckSaysWhatItKeepsWarm(t *testing.T) {
	dir := t.TempDir()
	w := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(w, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, fmt.Sprintf("[models.a]\ncommand = [\"e\", \"${PORT}\", %q]\nsleep = \"stop\"\n"+
		"[models.b]\ncommand = [\"e\", \"${PORT}\"]\nsleep = \"vllm-l1\"\nweights = [%q]\n", w, dir))
	var stdout, stderr bytes.Buffer
	if err := run(options{configPath: path, check: true}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{
		"weights of a: 1 file, 1 MiB, kept warm while its engine is stopped and host memory allows\n",
		`weights of b: 1 file, 1 MiB, not kept warm: its engine is never stopped (sleep = "vllm-l1", deep_sleep = "none")` + "\n",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout = %q, want it to hold %q", stdout.String(), want)
		}
	}
}
