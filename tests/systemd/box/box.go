//go:build linux

// Package box boots a throwaway systemd in private namespaces for tests, on
// machines whose PID 1 is not systemd (docs/systemd.md,
// ../shared/docs/systemd-box.md). The box runs on a copy-on-write overlay of
// the host's root with private /run and /tmp, its own network namespace (only
// loopback) and its own cgroups; it starts nothing but dbus and journald.
// Every box is torn down by t.Cleanup, also when the test fails or panics.
package box

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

//go:embed boot.sh
var bootScript []byte

// SharedPath is where the box sees its shared directory ((*Box).Shared on
// the host): a bind mount, so binaries written there on the host are visible
// in the box at once.
const SharedPath = "/napd-box"

// UnitDir is the box's own unit directory, first on its SYSTEMD_UNIT_PATH.
const UnitDir = SharedPath + "/units"

// Target is the unit the box's systemd boots into.
const Target = "napd-box.target"

// RequiredEnv, when set to 1, turns every skip of Boot into a failure, so CI
// (root, same machine kind) cannot silently skip the systemd tests.
const RequiredEnv = "NAPD_BOX_REQUIRED"

// copiedUnits come from the host's /lib/systemd/system into the box's unit
// directory; with them and the empty targets the box is running in ~1 s.
var copiedUnits = []string{
	"dbus.service", "dbus.socket",
	"systemd-journald.service", "systemd-journald.socket", "systemd-journald-dev-log.socket",
}

// Options changes how a box boots.
type Options struct {
	// UnitDirs are box paths appended to SYSTEMD_UNIT_PATH after UnitDir.
	UnitDirs []string
	// PackageUnitDirs makes the box look like a real host to dpkg: the box
	// starts with empty /etc/systemd/system and /lib/systemd/system (tmpfs,
	// so the host's units and their .wants/ never load) and both are on the
	// unit path after UnitDir. A package's units installed with dpkg -i, and
	// deb-systemd-helper's enable symlinks, then work as on a host.
	PackageUnitDirs bool
}

// Box is one booted systemd.
type Box struct {
	// PID is the box's systemd (PID 1 inside) as seen from the host.
	PID int

	dir       string // host work dir: upper, work, root, shared, cgroups, log
	cmd       *exec.Cmd
	exited    chan error // gets cmd.Wait's result
	closeOnce sync.Once
	closeErr  error
}

// Boot boots a box with default options; see BootWith.
func Boot(t testing.TB) *Box {
	t.Helper()
	return BootWith(t, Options{})
}

// BootWith boots a box and waits until its systemd is running. It skips the
// test (with the reason) where the box cannot work: not Linux, not root, a
// missing tool, or namespaces/overlayfs not permitted.
func BootWith(t testing.TB, opts Options) *Box {
	t.Helper()
	if why := unavailable(); why != "" {
		skip(t, why)
	}
	dir, err := os.MkdirTemp("", "napd-box-")
	if err != nil {
		t.Fatalf("box: %v", err)
	}
	script := filepath.Join(dir, "boot.sh")
	if err := os.WriteFile(script, bootScript, 0o755); err != nil {
		removeDir(dir)
		t.Fatalf("box: %v", err)
	}
	if out, err := exec.Command("/bin/sh", script, "probe", dir).CombinedOutput(); err != nil {
		removeDir(dir)
		skip(t, fmt.Sprintf("namespaces or overlayfs not permitted: %v: %s", err, bytes.TrimSpace(out)))
	}
	if err := writeUnits(filepath.Join(dir, "shared", "units")); err != nil {
		removeDir(dir)
		t.Fatalf("box: %v", err)
	}
	b, err := start(dir, opts)
	if b != nil {
		t.Cleanup(func() {
			if t.Failed() {
				b.logDiagnostics(t)
			}
			if err := b.Close(); err != nil {
				t.Errorf("box teardown: %v", err)
			}
		})
	} else {
		removeDir(dir)
	}
	if err != nil {
		t.Fatalf("box: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.WaitRunning(ctx); err != nil {
		t.Fatalf("box: %v", err)
	}
	return b
}

func skip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatalf("systemd box required (%s=1) but unavailable: %s", RequiredEnv, why)
	}
	t.Skipf("systemd box unavailable: %s", why)
}

// unavailable says why a box cannot boot here, or "".
func unavailable() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	for _, tool := range []string{"unshare", "nsenter", "ip", "mount", "pivot_root"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found"
		}
	}
	for _, f := range []string{"/lib/systemd/systemd", "/sys/fs/cgroup"} {
		if _, err := os.Stat(f); err != nil {
			return err.Error()
		}
	}
	return ""
}

// writeUnits fills the box's own unit directory.
func writeUnits(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, u := range copiedUnits {
		data, err := os.ReadFile(filepath.Join("/lib/systemd/system", u))
		if err != nil {
			return fmt.Errorf("copy host unit: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, u), data, 0o644); err != nil {
			return err
		}
	}
	units := map[string]string{
		"sysinit.target":  "[Unit]\nDescription=System Initialization (napd box)\n",
		"basic.target":    "[Unit]\nDescription=Basic System (napd box)\n",
		"sockets.target":  "[Unit]\nDescription=Sockets (napd box)\n",
		"shutdown.target": "[Unit]\nDescription=Shutdown (napd box)\nDefaultDependencies=no\n",
		Target: "[Unit]\nDescription=napd test box\n" +
			"Wants=dbus.socket dbus.service systemd-journald.socket systemd-journald.service\n",
	}
	for name, content := range units {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// start runs boot.sh and finds the box's systemd. A non-nil Box is returned
// whenever something was started, so the caller can tear it down.
func start(dir string, opts Options) (*Box, error) {
	// The transient units' directory is on every host's unit path; without
	// it a daemon-reload loses transient units (napd's engines): they keep
	// running as not-found units whose files are never removed.
	unitPath := []string{UnitDir, "/run/systemd/transient"}
	pkgDirs := ""
	if opts.PackageUnitDirs {
		unitPath = append(unitPath, "/etc/systemd/system", "/lib/systemd/system")
		pkgDirs = "1"
	}
	unitPath = append(unitPath, opts.UnitDirs...)
	for _, p := range unitPath {
		// A ':' or an empty entry would append systemd's default paths and
		// boot the host's services inside the box.
		if p == "" || strings.Contains(p, ":") {
			return nil, fmt.Errorf("bad unit dir %q", p)
		}
	}
	logf, err := os.Create(filepath.Join(dir, "boot.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cgname := filepath.Base(dir)
	cmd := exec.Command("/bin/sh", filepath.Join(dir, "boot.sh"), "host", dir, cgname,
		strings.Join(unitPath, ":"), pkgDirs)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies without its cleanups, unshare dies with it and
	// (--kill-child) takes the box down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start boot.sh: %w", err)
	}
	exited := make(chan error, 1)
	b := &Box{dir: dir, cmd: cmd, exited: exited}
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for b.PID == 0 {
		select {
		case err := <-exited:
			exited <- err
			return b, fmt.Errorf("boot.sh exited (%v): %s", err, b.bootLog())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return b, fmt.Errorf("no systemd in the box after 10s: %s", b.bootLog())
		}
		b.PID = systemdChild(cmd.Process.Pid)
	}
	return b, nil
}

// systemdChild is the pid of unshare's child once it has exec'd systemd, or 0.
func systemdChild(pid int) int {
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if strings.TrimSpace(string(comm)) != "unshare" {
		return 0
	}
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	f := strings.Fields(string(children))
	if len(f) != 1 {
		return 0
	}
	child, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	comm, _ = os.ReadFile(fmt.Sprintf("/proc/%d/comm", child))
	if strings.TrimSpace(string(comm)) != "systemd" {
		return 0
	}
	return child
}

func (b *Box) bootLog() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "boot.log"))
	return strings.TrimSpace(string(data))
}

// Shared is the host directory the box sees at SharedPath.
func (b *Box) Shared() string { return filepath.Join(b.dir, "shared") }

// Path is the host path of a box path, through /proc/<pid>/root (for reading
// what the box wrote, or writing anywhere in its overlay).
func (b *Box) Path(boxPath string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", b.PID), boxPath)
}

// CopyIn copies a host file into the box (its overlay), keeping the mode.
func (b *Box) CopyIn(hostPath, boxPath string) error {
	src, err := os.Open(hostPath)
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	dst := b.Path(boxPath)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, st.Mode().Perm())
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return fmt.Errorf("copy in %s: %w", boxPath, err)
	}
	return out.Close()
}

// InstallUnit writes a unit file into UnitDir and reloads the box's systemd.
func (b *Box) InstallUnit(ctx context.Context, name, content string) error {
	if err := os.WriteFile(filepath.Join(b.Shared(), "units", name), []byte(content), 0o644); err != nil {
		return fmt.Errorf("install unit %s: %w", name, err)
	}
	if _, stderr, err := b.Run(ctx, "systemctl", "daemon-reload"); err != nil {
		return fmt.Errorf("install unit %s: daemon-reload: %w: %s", name, err, stderr)
	}
	return nil
}

// Run runs argv inside the box (all its namespaces, its root) with a clean
// environment; add variables with "env K=V cmd …".
func (b *Box) Run(ctx context.Context, argv ...string) (stdout, stderr string, err error) {
	cmd := b.Command(ctx, argv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("in box: %s: %w", strings.Join(argv, " "), err)
	}
	return out.String(), errb.String(), err
}

// Command is an exec.Cmd that runs argv inside the box, for callers that
// stream its output or set its stdin.
func (b *Box) Command(ctx context.Context, argv ...string) *exec.Cmd {
	args := append([]string{"-t", strconv.Itoa(b.PID), "-a", "--root", "--wd", "--"}, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0",
	}
	return cmd
}

// WaitRunning waits until the box's systemd reports "running". A
// "degraded" box is an error naming the failed units.
func (b *Box) WaitRunning(ctx context.Context) error {
	for {
		out, _, _ := b.Run(ctx, "systemctl", "is-system-running")
		switch state := strings.TrimSpace(out); state {
		case "running":
			return nil
		case "degraded":
			failed, _, _ := b.Run(ctx, "systemctl", "--failed", "--no-legend", "--plain")
			return fmt.Errorf("box degraded: %s", strings.TrimSpace(failed))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("box not running: %w (last state %q; boot log: %s)", ctx.Err(), strings.TrimSpace(out), b.bootLog())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logDiagnostics logs the box's failed units and journal tail.
func (b *Box) logDiagnostics(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	units, _, _ := b.Run(ctx, "systemctl", "list-units", "--all", "--no-legend", "--plain")
	journal, _, _ := b.Run(ctx, "journalctl", "--no-pager", "-n", "80")
	t.Logf("box units:\n%s\nbox journal:\n%s", units, journal)
}

// Close kills the box (SIGKILL to its PID-namespace init ends every process
// in it, and with them its mount namespace and mounts), removes its cgroups
// and its work dir. It is idempotent and registered with t.Cleanup by Boot.
func (b *Box) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.close() })
	return b.closeErr
}

func (b *Box) close() error {
	var errs []error
	if b.PID != 0 {
		if err := syscall.Kill(b.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill box: %w", err))
		}
	}
	if b.cmd.Process != nil {
		_ = b.cmd.Process.Kill()
	}
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		errs = append(errs, errors.New("boot.sh did not exit"))
	}
	if err := removeCgroups(filepath.Join(b.dir, "cgroups")); err != nil {
		errs = append(errs, err)
	}
	removeDir(b.dir)
	return errors.Join(errs...)
}

// removeCgroups removes the box's cgroups bottom-up, waiting (bounded) for
// the killed processes to leave them.
func removeCgroups(list string) error {
	data, err := os.ReadFile(list)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, root := range strings.Fields(string(data)) {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			deadline := time.Now().Add(5 * time.Second)
			for {
				err := syscall.Rmdir(dirs[i])
				if err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
					errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return errors.Join(errs...)
}

// removeDir removes a box work dir. Its mounts lived only in the box's
// private mount namespace, so on the host these are plain directories.
func removeDir(dir string) {
	if dir == "" || dir == "/" {
		return
	}
	_ = os.RemoveAll(dir)
}
