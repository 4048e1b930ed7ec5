package demoengine

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func writeFile(t *testing.T, path string, size int) {
	t.Helper()
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadPaths_DirectoryIsItsRegularFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "b.safetensors"), 10)
	writeFile(t, filepath.Join(dir, "a.safetensors"), 10)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := LoadPaths(dir)
	want := []string{filepath.Join(dir, "a.safetensors"), filepath.Join(dir, "b.safetensors")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("LoadPaths(dir) = %q, %v; want %q", got, err, want)
	}
	if got, err := LoadPaths(want[0]); err != nil || !slices.Equal(got, want[:1]) {
		t.Fatalf("LoadPaths(file) = %q, %v", got, err)
	}
	if _, err := LoadPaths(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("LoadPaths(missing) succeeded")
	}
	if _, err := LoadPaths("/dev/null"); err == nil {
		t.Fatal("LoadPaths(/dev/null) succeeded")
	}
}

// The engine is loading until every byte is read, and a paced read takes
// at least size/rate (a lower bound the pacing guarantees, not a timing).
func TestEngine_LoadFilesPacedBeforeHealthy(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	writeFile(t, a, 3*loadChunk/2)
	writeFile(t, b, loadChunk/2)
	const rate = 8 * loadChunk // 2 chunks' worth: at least 250ms
	start := time.Now()
	e := newEngine(Options{LoadFiles: []string{a, b}, LoadRate: rate})
	h := e.Handler()
	rec := do(h, "GET", "/health", "")
	if st := e.Stats(); !st.Loaded && rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("/health = %d while %d of %d bytes were read", rec.Code, st.LoadedBytes, st.LoadBytes)
	}
	for !e.Stats().Loaded {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("not loaded after 10s: %+v", e.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if took, least := time.Since(start), time.Duration(2*loadChunk)*time.Second/rate; took < least {
		t.Fatalf("loaded in %v, faster than the %v the rate allows", took, least)
	}
	st := e.Stats()
	if st.LoadedBytes != 2*loadChunk || st.LoadBytes != 2*loadChunk {
		t.Fatalf("loaded %d of %d bytes, want %d of %d", st.LoadedBytes, st.LoadBytes, 2*loadChunk, 2*loadChunk)
	}
	wantCode(t, do(h, "GET", "/health", ""), http.StatusOK)
}

func TestEngine_LoadFileUnreadableExits(t *testing.T) {
	var x exits
	e := New(Options{LoadFiles: []string{filepath.Join(t.TempDir(), "gone")}, Exit: x.exit, Logger: quiet()})
	for len(x.get()) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if got := x.get(); !slices.Equal(got, []int{1}) {
		t.Fatalf("exit calls = %v, want [1]", got)
	}
	wantCode(t, do(e.Handler(), "GET", "/health", ""), http.StatusServiceUnavailable)
}
