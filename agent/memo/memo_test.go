package memo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const fileName = "footprints.json"

func TestStore_RememberPersists(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, fileName))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get("qwen3-8b"); ok {
		t.Fatal("empty store has a footprint")
	}
	if err := s.Remember("qwen3-8b", 20<<30); err != nil {
		t.Fatal(err)
	}
	if err := s.Remember("embed", 2<<30); err != nil {
		t.Fatal(err)
	}
	again, err := Open(filepath.Join(dir, fileName))
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := again.Get("qwen3-8b"); !ok || b != 20<<30 {
		t.Errorf("reloaded qwen3-8b = %d, %v", b, ok)
	}
	if got := again.All(); len(got) != 2 || got["embed"] != 2<<30 {
		t.Errorf("All = %v", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("state dir holds %d entries, want only %s (no temp files left)", len(entries), fileName)
	}
}

func TestStore_IgnoresNonPositive(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(filepath.Join(dir, fileName))
	if err := s.Remember("m", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, fileName)); !os.IsNotExist(err) {
		t.Errorf("file written for a zero footprint: %v", err)
	}
}

func TestOpen_CorruptFileIsAnError(t *testing.T) {
	for _, content := range []string{"{not json", `{"m": -5}`} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, fileName), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(filepath.Join(dir, fileName)); err == nil || !strings.Contains(err.Error(), fileName) {
			t.Errorf("%q: err = %v, want one naming the file", content, err)
		}
	}
}

func TestStore_WriteFailureKeepsOldValue(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gone")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, _ := Open(filepath.Join(dir, fileName))
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := s.Remember("m", 1); err == nil {
		t.Fatal("want a write error")
	}
	if _, ok := s.Get("m"); ok {
		t.Error("an unwritten footprint is visible")
	}
}

func TestStore_ConcurrentRemember(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(filepath.Join(dir, fileName))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if err := s.Remember(fmt.Sprintf("m%d", i), int64(i+1)<<30); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	again, err := Open(filepath.Join(dir, fileName))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(again.All()); got != 8 {
		t.Errorf("reloaded %d footprints, want 8", got)
	}
}
