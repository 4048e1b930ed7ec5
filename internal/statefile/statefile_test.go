package statefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestWriteRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.json")
	if _, err := Read(path, 100); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := Write(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path, 100)
	if err != nil || string(got) != "two" {
		t.Fatalf("Read = %q, %v", got, err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %s", fi.Mode().Perm())
	}
	if _, err := Read(path, 2); err == nil {
		t.Error("a file over the limit was read")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

// A planted symlink is neither followed by a read nor written through.
func TestSymlinkNotFollowed(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "x.json")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path, 100); !errors.Is(err, ErrUnsafe) {
		t.Errorf("Read through a symlink: %v", err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "secret" {
		t.Errorf("write went through the symlink: target holds %q", b)
	}
	if fi, _ := os.Lstat(path); !fi.Mode().IsRegular() {
		t.Errorf("path is %s after the write, want a regular file", fi.Mode())
	}
}

func TestUnsafeFilesRefused(t *testing.T) {
	dir := t.TempDir()
	writable := filepath.Join(dir, "writable")
	if err := os.WriteFile(writable, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(writable, 0o666); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []string{writable, fifo, dir}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(dir, "foreign")
		if err := os.WriteFile(foreign, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, foreign)
	}
	for _, p := range cases {
		if _, err := Read(p, 100); !errors.Is(err, ErrUnsafe) {
			t.Errorf("%s: %v, want ErrUnsafe", filepath.Base(p), err)
		}
	}
}
