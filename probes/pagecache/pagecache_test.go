//go:build linux

package pagecache

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// weights writes a file of size bytes (not a multiple of the page size)
// and syncs it, so that its pages are clean and Drop can drop them.
var c Cache

func weights(t *testing.T, size int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "w.safetensors")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func resident(t *testing.T, path string) int64 {
	t.Helper()
	r, _, err := c.Resident(path)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The file napd warms is counted resident; the test evicts it and the
// count falls. A kernel (or filesystem: tmpfs) that keeps the pages is
// told in the log, and the count must then still be the whole file.
func TestWarmDropResident(t *testing.T) {
	const size = 3*Chunk + 12345
	path := weights(t, size)
	r, got, err := c.Resident(path)
	if err != nil || got != size || r < 0 || r > size {
		t.Fatalf("Resident = %d of %d, %v; want 0..%d of %d", r, got, err, size, size)
	}
	if err := c.Drop(path); err != nil {
		t.Fatal(err)
	}
	dropped := resident(t, path)
	if dropped == size {
		t.Logf("the kernel kept all %d bytes after POSIX_FADV_DONTNEED: eviction not observable here", size)
	}
	if err := c.Warm(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	// readahead returns once the reads are queued: wait for them, bounded.
	// The kernel may drop a few pages again at any time (a busy VM's page
	// cache does, with memory to spare): nine tenths resident is warm.
	warm := int64(size) * 9 / 10
	deadline := time.Now().Add(10 * time.Second)
	for resident(t, path) < warm && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := resident(t, path); r < warm {
		t.Fatalf("after Warm %d of %d bytes resident (after Drop: %d), want nine tenths at least", r, size, dropped)
	}
	if err := c.Drop(path); err != nil {
		t.Fatal(err)
	}
	if after := resident(t, path); dropped < size && after >= size {
		t.Fatalf("after the second Drop %d of %d bytes resident; the first dropped to %d", after, size, dropped)
	}
}

func TestWarmCancelled(t *testing.T) {
	path := weights(t, 2*Chunk)
	if err := c.Drop(path); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Warm(ctx, path); !errors.Is(err, context.Canceled) {
		t.Fatalf("Warm(cancelled) = %v, want context.Canceled", err)
	}
}

func TestEmptyAndMissing(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, size, err := c.Resident(empty); err != nil || r != 0 || size != 0 {
		t.Fatalf("Resident(empty) = %d, %d, %v", r, size, err)
	}
	if err := c.Warm(context.Background(), empty); err != nil {
		t.Fatalf("Warm(empty) = %v", err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	if _, _, err := c.Resident(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Resident(missing) = %v", err)
	}
	if err := c.Warm(context.Background(), missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Warm(missing) = %v", err)
	}
	if err := c.Drop(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Drop(missing) = %v", err)
	}
}

// Warm leaves the calling thread's I/O and CPU priorities as they were.
func TestWarmRestoresIOPriority(t *testing.T) {
	path := weights(t, Chunk)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, 0, 0)
	if e != 0 {
		t.Skipf("ioprio_get: %v", e)
	}
	sched, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Skipf("sched_getattr: %v", err)
	}
	if err := c.Warm(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if after, _, _ := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, 0, 0); after != before {
		t.Fatalf("I/O priority %#x after Warm, %#x before", after, before)
	}
	if after, err := unix.SchedGetAttr(0, 0); err != nil || after.Policy != sched.Policy || after.Nice != sched.Nice {
		t.Fatalf("scheduling %+v, %v after Warm; %+v before", after, err, sched)
	}
}

// A paced warm takes at least size/Rate (the pacing's lower bound, not a
// timing) and still reads the whole file in.
func TestWarmPaced(t *testing.T) {
	path := weights(t, 3*Chunk)
	if err := c.Drop(path); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := (Cache{Rate: 10 * Chunk}).Warm(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	// The third chunk is asked for at 2 Chunks / Rate.
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("warm took %v, faster than the rate allows", took)
	}
}
