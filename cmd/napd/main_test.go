package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
