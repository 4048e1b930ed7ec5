package statefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestDir_CreatesAPrivateDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "state")
	if err := Dir(path, 0o750); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		t.Fatalf("created %v, %v", fi, err)
	}
	if err := Dir(path, 0o750); err != nil {
		t.Errorf("an existing safe directory: %v", err)
	}
}

func TestDir_RefusesWhatOthersControl(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory away")
	}
	base := t.TempDir()
	mk := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, -1); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign := mk("foreign", 0o755, 65534)
	groupWritable := mk("group", 0o775, 0)
	worldParent := mk("world", 0o777, 0)
	inWorld := filepath.Join(worldParent, "state")
	if err := os.Mkdir(inWorld, 0o755); err != nil {
		t.Fatal(err)
	}
	foreignParent := mk("theirs", 0o755, 65534)
	own := mk("own", 0o755, 0)
	link := filepath.Join(foreignParent, "link")
	if err := os.Symlink(own, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, -1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{foreign, "owner uid 65534, mode -rwxr-xr-x"},
		{groupWritable, "mode -rwxrwxr-x"},
		{inWorld, "its parent " + worldParent},
		{link, "a symlink owned by uid 65534"},
		{filepath.Join(foreign, "sub"), "its parent " + foreign}, // nothing created inside it
	} {
		err := Dir(c.path, 0o750)
		if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("Dir(%s) = %v, want ErrUnsafeDir naming the path and %q", c.path, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(foreign, "sub")); err == nil {
		t.Error("a directory was created inside the foreign one")
	}
	// A sticky, world-writable parent (like /tmp) is fine for a directory
	// napd owns.
	sticky := mk("sticky", 0o777|os.ModeSticky, 0)
	if err := Dir(filepath.Join(sticky, "napd"), 0o700); err != nil {
		t.Errorf("own directory in a sticky parent: %v", err)
	}
}

func TestOpenAppend_FollowsNoSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "passwd")
	if err := os.WriteFile(target, []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(dir, "m.log")
	if err := os.Symlink(target, planted); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenAppend(planted, 0o640); !errors.Is(err, ErrUnsafe) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("OpenAppend through a symlink: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "root:x:0:0\n" {
		t.Errorf("target changed: %q", b)
	}
	fifo := filepath.Join(dir, "fifo.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// No reader: the open fails at once (ENXIO) instead of blocking.
	if f, err := OpenAppend(fifo, 0o640); err == nil {
		f.Close()
		t.Error("OpenAppend opened a FIFO")
	}
	// The mode is set on the open file, whatever the file had.
	loose := filepath.Join(dir, "loose.log")
	if err := os.WriteFile(loose, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(loose, 0o666)
	f, err := OpenAppend(loose, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, _ := os.Stat(loose); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %s, want 0640", fi.Mode().Perm())
	}
}

func TestReadRegular_RefusesDevicesAndBigFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 101), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/dev/zero": "not a regular file but a character device",
		fifo:        "not a regular file but a named pipe",
		dir:         "not a regular file but a directory",
		big:         "101 bytes, more than 100",
	} {
		if _, err := ReadRegular(path, 100); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ReadRegular(%s) = %v, want %q", path, err, want)
		}
	}
}

// A secret's file may be read by its owner and group only.
func TestReadPrivate_RefusesWhatEveryoneReads(t *testing.T) {
	dir := t.TempDir()
	for mode, ok := range map[os.FileMode]bool{0o600: true, 0o640: true, 0o644: false, 0o606: false} {
		path := filepath.Join(dir, mode.String())
		if err := os.WriteFile(path, []byte("sk-x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		b, err := ReadPrivate(path, 100)
		if ok && (err != nil || string(b) != "sk-x\n") {
			t.Errorf("mode %s: %q, %v", mode, b, err)
		}
		if !ok && (err == nil || !strings.Contains(err.Error(), "lets every user read it") || strings.Contains(err.Error(), "sk-x")) {
			t.Errorf("mode %s: %v, want a refusal that does not show the secret", mode, err)
		}
	}
	if _, err := ReadPrivate("/dev/zero", 100); err == nil {
		t.Error("a device was read")
	}
}
