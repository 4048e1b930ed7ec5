package harness

import (
	"os"
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
