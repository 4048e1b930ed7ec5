package daemon

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// demoTemplate is a template for demo-engine models: each model that takes
// it runs the engine under its own name (${MODEL}).
const demoTemplate = `[templates.demo]
command = ["${BIN}/napd-demo-engine", "--host", "127.0.0.1", "--port", "${PORT}", "--model", "${MODEL}", "--startup-delay", "200ms"]
sleep = "stop"
`

// Drop-ins are read at reload: a new one adds its models (a template of
// the main file's is taken by a drop-in's model); a broken one refuses
// the whole reload, naming its file and line, and the running models
// keep serving; removing it makes the next reload good again.
func TestReload_DropIns(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: demo("keep", "") + demoTemplate})
	ctx := context.Background()
	napctl := func(t *testing.T, wantOK bool, args ...string) string { return runNapctl(t, n, wantOK, args...) }
	// reloaded waits for the count-th "config reloaded".
	reloaded := func(count int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(n.Log(), "config reloaded") < count {
			if time.Now().After(deadline) {
				t.Fatalf("no reload %d:\n%s", count, n.Log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	dir := filepath.Join(n.Dir, "napd.d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10-extra.toml", "[models.extra]\ntemplate = \"demo\"\n")
	write("10-extra.toml~", "[models.backup]\nbroken = \n")
	n.Signal(syscall.SIGHUP)
	reloaded(1)
	if r := post(ctx, n, "extra", harness.Chat("extra", false, 2)); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("model of the drop-in: %v", r)
	}
	if out := napctl(t, true, "config", "check"); strings.TrimSpace(out) != n.Config+": ok (2 models, 1 drop-ins)" {
		t.Errorf("config check: %q", out)
	}
	if out := napctl(t, true, "config", "show", "extra"); !strings.Contains(out, "--model\", \"extra\"") ||
		!strings.Contains(out, "(template demo)") {
		t.Errorf("config show extra:\n%s", out)
	}

	mark := len(n.Log())
	write("20-broken.toml", "[models.more]\ntemplate = \"demo\"\n\n[policy]\nidle_timeout = \"1s\"\n")
	n.Signal(syscall.SIGHUP)
	n.WaitLog("config reload refused", 10*time.Second)
	if !regexp.MustCompile(`20-broken\.toml:4: policy: \[policy\] belongs in the main file`).MatchString(n.Log()[mark:]) {
		t.Errorf("refused reload's log does not name the drop-in's file and line:\n%s", n.Log()[mark:])
	}
	for _, m := range []string{"keep", "extra"} {
		if r := post(ctx, n, m, harness.Chat(m, false, 2)); r.err != nil || r.status != http.StatusOK {
			t.Errorf("%s after the refused reload: %v", m, r)
		}
	}
	if r := post(ctx, n, "more", harness.Chat("more", false, 2)); r.status != http.StatusNotFound {
		t.Errorf("model of the refused drop-in: %v, want 404", r)
	}
	if out := napctl(t, false, "config", "check"); !strings.Contains(out, "20-broken.toml:4: policy") {
		t.Errorf("config check of the broken drop-in: %q", out)
	}

	if err := os.Remove(filepath.Join(dir, "20-broken.toml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "10-extra.toml")); err != nil {
		t.Fatal(err)
	}
	n.Signal(syscall.SIGHUP)
	reloaded(2)
	if r := post(ctx, n, "extra", harness.Chat("extra", false, 2)); r.status != http.StatusNotFound {
		t.Errorf("model of the removed drop-in: %v, want 404", r)
	}
}
