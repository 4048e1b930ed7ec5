//go:build linux

package harness

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Prepare writes a config like Start does but does not start napd, so a
// test can set up what napd talks to (a NOTIFY_SOCKET listener that probes
// the gateway) before Launch.
func Prepare(t testing.TB, o Options) *Napd {
	t.Helper()
	dir, err := os.MkdirTemp("", "napd-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path, addr, metrics, socket := WriteConfig(t, dir, o)
	return &Napd{t: t, Dir: dir, Config: path, Addr: addr, Metrics: metrics, Socket: socket}
}

// Launch starts a prepared napd with extra environment and waits until the
// gateway answers /health.
func (n *Napd) Launch(env ...string) {
	n.t.Helper()
	n.start(env)
}

// Kill SIGKILLs napd, as a crash would, and waits for it to exit. Launch
// starts it again on the same config and state.
func (n *Napd) Kill() {
	n.t.Helper()
	_ = n.Cmd.Process.Kill()
	<-n.done
}

// MarkEnv is the environment variable Marked looks for.
const MarkEnv = "NAPD_TEST_MARK"

// Marked lists the live processes whose environment holds MarkEnv=mark: an
// engine given that variable (a model's environment table) and everything it
// spawned, grandchildren included.
func Marked(mark string) []int {
	want := []byte(MarkEnv + "=" + mark + "\x00")
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), append([]byte{0}, want...)) {
			continue
		}
		// A zombie has no environment left to read, so it never gets here.
		pids = append(pids, pid)
	}
	return pids
}

// RewriteModels replaces the [models.*] tables of napd's config file (all
// of it from the first "[models." on) with models, "${BIN}" expanded as in
// Options.Models. Listeners and state stay the same, so a SIGHUP reload
// sees only the model changes.
func (n *Napd) RewriteModels(models string) {
	n.t.Helper()
	b, err := os.ReadFile(n.Config)
	if err != nil {
		n.t.Fatal(err)
	}
	head, _, _ := strings.Cut(string(b), "[models.")
	body := head + strings.ReplaceAll(models, "${BIN}", Bin(n.t))
	// Write a sibling and rename: napd never reads a half-written file.
	tmp := n.Config + ".new"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, n.Config); err != nil {
		n.t.Fatal(err)
	}
}
