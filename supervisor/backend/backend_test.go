//go:build linux

package backend

import (
	"context"
	"strings"
	"testing"

	"github.com/napd/napd/supervisor"
)

func TestOpen_ExecAndUnknown(t *testing.T) {
	b, err := Open(context.Background(), supervisor.KindExec, supervisor.OpenOptions{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Name() != string(supervisor.KindExec) {
		t.Errorf("exec backend is named %q", b.Name())
	}
	if _, err := Open(context.Background(), supervisor.KindExec, supervisor.OpenOptions{}); err == nil || !strings.Contains(err.Error(), "exec supervisor") {
		t.Errorf("exec without a state directory: %v", err)
	}
	if _, err := Open(context.Background(), "k8s", supervisor.OpenOptions{StateDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), `"k8s"`) {
		t.Errorf("an unknown kind: %v", err)
	}
}

// Without a system bus (the build machines' PID 1 is not systemd) auto
// falls back to exec; with one, to systemd. Either way it opens a backend
// of the kind it chose.
func TestOpen_AutoChoosesABackend(t *testing.T) {
	b, err := Open(context.Background(), supervisor.KindAuto, supervisor.OpenOptions{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if n := supervisor.Kind(b.Name()); n != supervisor.KindExec && n != supervisor.KindSystemd {
		t.Errorf("auto opened %q", n)
	}
}
