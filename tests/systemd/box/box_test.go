//go:build linux

package box

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBox_BootRunTeardown(t *testing.T) {
	marker, err := os.CreateTemp("", "napd-box-host-marker-")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	t.Cleanup(func() { os.Remove(marker.Name()) })

	b := Boot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	out, _, err := b.Run(ctx, "systemctl", "list-units", "--no-legend", "--plain", "--type=service", "--state=active")
	if err != nil {
		t.Fatal(err)
	}
	var active []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		active = append(active, strings.Fields(l)[0])
	}
	if got := strings.Join(active, " "); got != "dbus.service systemd-journald.service" {
		t.Errorf("active services in box = %q, want only dbus and journald", got)
	}

	// The box's /tmp is private: the host's file is not visible in it.
	if _, _, err := b.Run(ctx, "test", "-e", marker.Name()); err == nil {
		t.Errorf("host /tmp file %s visible in the box", marker.Name())
	}
	// Loopback is up and private to the box.
	if out, _, err := b.Run(ctx, "ip", "-o", "link", "show", "lo"); err != nil || !strings.Contains(out, "UP") {
		t.Errorf("lo in box: %q %v", out, err)
	}

	// The shared dir is the same directory on both sides; CopyIn writes
	// into the overlay only.
	if err := os.WriteFile(filepath.Join(b.Shared(), "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := b.Run(ctx, "cat", SharedPath+"/hello"); err != nil || out != "hi" {
		t.Errorf("shared file in box = %q, %v", out, err)
	}
	if err := b.CopyIn(marker.Name(), "/etc/napd-box-copied"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Run(ctx, "test", "-e", "/etc/napd-box-copied"); err != nil {
		t.Errorf("copied file missing in box: %v", err)
	}
	if _, err := os.Stat("/etc/napd-box-copied"); err == nil {
		t.Errorf("CopyIn wrote to the host's /etc")
	}

	// Transient units get memory accounting in the box's own cgroups.
	if _, stderr, err := b.Run(ctx, "systemd-run", "-u", "box-sleeper", "-p", "MemoryAccounting=yes", "sleep", "60"); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	out, _, err = b.Run(ctx, "systemctl", "show", "box-sleeper.service", "-p", "MemoryCurrent", "-p", "ActiveState")
	if err != nil || !strings.Contains(out, "ActiveState=active") || strings.Contains(out, "MemoryCurrent=[not set]") {
		t.Errorf("transient unit in box: %q, %v", out, err)
	}

	dir := b.dir
	cgroups, err := os.ReadFile(filepath.Join(dir, "cgroups"))
	if err != nil || len(strings.Fields(string(cgroups))) == 0 {
		t.Fatalf("box cgroups not recorded: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("box dir %s left after Close: %v", dir, err)
	}
	for _, cg := range strings.Fields(string(cgroups)) {
		if _, err := os.Stat(cg); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left after Close: %v", cg, err)
		}
	}
	if _, err := os.Stat(marker.Name()); err != nil {
		t.Errorf("host /tmp touched by the box: %v", err)
	}
}

// TestBox_PackageUnitDirs shows the path the package test takes: a unit
// installed into /lib/systemd/system inside the box (as dpkg does), enabled
// and started like on a host, with none of the host's units loaded.
func TestBox_PackageUnitDirs(t *testing.T) {
	b := BootWith(t, Options{PackageUnitDirs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	sock := "[Unit]\nDescription=box test socket\n[Socket]\nListenStream=127.0.0.1:7411\n[Install]\nWantedBy=sockets.target\n"
	svc := "[Unit]\nDescription=box test service\nRequires=box-pkg.socket\n[Service]\nExecStart=/bin/cat\nStandardInput=socket\n"
	if err := os.WriteFile(b.Path("/lib/systemd/system/box-pkg.socket"), []byte(sock), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.Path("/lib/systemd/system/box-pkg.service"), []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, argv := range [][]string{
		{"systemctl", "daemon-reload"},
		// As a postinst runs them (they refuse to run outside dpkg).
		{"env", "DPKG_MAINTSCRIPT_PACKAGE=box-pkg", "DPKG_MAINTSCRIPT_NAME=postinst", "deb-systemd-helper", "enable", "box-pkg.socket"},
		{"env", "DPKG_MAINTSCRIPT_PACKAGE=box-pkg", "DPKG_MAINTSCRIPT_NAME=postinst", "deb-systemd-invoke", "start", "box-pkg.socket"},
	} {
		if _, stderr, err := b.Run(ctx, argv...); err != nil {
			t.Fatalf("%v: %s", err, stderr)
		}
	}
	out, _, _ := b.Run(ctx, "systemctl", "is-active", "box-pkg.socket")
	if strings.TrimSpace(out) != "active" {
		t.Errorf("box-pkg.socket is %q, want active", out)
	}
	out, _, _ = b.Run(ctx, "systemctl", "is-enabled", "box-pkg.socket")
	if strings.TrimSpace(out) != "enabled" {
		t.Errorf("box-pkg.socket enablement %q, want enabled", out)
	}
	if _, err := os.Stat("/lib/systemd/system/box-pkg.socket"); err == nil {
		t.Errorf("unit written to the host's /lib/systemd/system")
	}
	// Only the box's own services run: the host's /lib units are hidden.
	out, _, _ = b.Run(ctx, "systemctl", "list-units", "--no-legend", "--plain", "--type=service", "--state=active")
	if n := len(strings.Split(strings.TrimSpace(out), "\n")); n != 2 {
		t.Errorf("active services in box:\n%s", out)
	}
}
