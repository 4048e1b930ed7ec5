package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	workerOnce sync.Once
	workerPath string
	workerErr  error
)

// ExampleWorker builds the engine contract's example worker (engine/example)
// once per test binary and returns the path of the program.
func ExampleWorker(t testing.TB) string {
	t.Helper()
	workerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "napd-e2e-worker-")
		if err != nil {
			workerErr = err
			return
		}
		workerPath = filepath.Join(dir, "echo-worker")
		cmd := exec.Command("go", "build", "-o", workerPath, "./engine/example")
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			workerErr = fmt.Errorf("go build ./engine/example: %v\n%s", err, out)
		}
	})
	if workerErr != nil {
		t.Fatal(workerErr)
	}
	return workerPath
}

// IPCAddress is a fresh ipc:// address in a short directory removed when
// the test ends (unix socket paths are limited to about 100 bytes).
func IPCAddress(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "napd-ipc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return "ipc://" + filepath.Join(dir, name+".sock")
}

// SetAgent adds lines to the [agent] table of a prepared napd's config
// (e.g. events_address); call it between Prepare and Launch.
func (n *Napd) SetAgent(lines string) {
	n.t.Helper()
	b, err := os.ReadFile(n.Config)
	if err != nil {
		n.t.Fatal(err)
	}
	s := strings.Replace(string(b), "[agent]\n", "[agent]\n"+strings.TrimSpace(lines)+"\n", 1)
	if err := os.WriteFile(n.Config, []byte(s), 0o644); err != nil {
		n.t.Fatal(err)
	}
}
