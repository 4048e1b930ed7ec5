package process

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLogFile_RotatesAndKeeps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	l, err := openLog(path, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		fmt.Fprintf(l, "line %02d %s\n", i, strings.Repeat("-", 30)) // 39 bytes
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// 2 lines per file: 08-09 current, 06-07 in .1, 04-05 in .2; older gone.
	for suffix, want := range map[string]string{"": "line 08", ".1": "line 06", ".2": "line 04"} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), want) || len(b) != 78 {
			t.Errorf("%s%s = %q", path, suffix, b)
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf(".3 exists: %v", err)
	}
	if _, err := l.Write([]byte("x")); err == nil {
		t.Error("write after Close succeeded")
	}
	// Reopening appends to the current file.
	l, err = openLog(path, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.size != 78 {
		t.Errorf("reopened size %d", l.size)
	}
}

func TestTailLines(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := range 20000 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	path := filepath.Join(dir, "big.log")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := tailLines(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"line 19997", "line 19998", "line 19999"}) {
		t.Errorf("tail = %q", got)
	}
	got, _ = tailLines(path, 15000) // spans several chunks
	if len(got) != 15000 || got[0] != "line 5000" {
		t.Errorf("long tail: %d lines, first %q", len(got), got[0])
	}
	short := filepath.Join(dir, "short.log")
	if err := os.WriteFile(short, []byte("a\nb"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := tailLines(short, 5); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("short tail = %q", got)
	}
	empty := filepath.Join(dir, "empty.log")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := tailLines(empty, 5); err != nil || len(got) != 0 {
		t.Errorf("empty tail = %q %v", got, err)
	}
	if _, err := tailLines(filepath.Join(dir, "missing"), 1); err == nil {
		t.Error("tail of a missing file succeeded")
	}
}
