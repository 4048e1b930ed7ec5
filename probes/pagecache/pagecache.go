//go:build linux

// Package pagecache reads files into the host's page cache, measures how
// much of them is resident, and drops them from it: napd keeps a sleeping
// model's weight files warm so that its next wake reads them from RAM.
//
// Warming runs at idle I/O priority (IOPRIO_CLASS_IDLE) and idle CPU
// priority (SCHED_IDLE), so that it only uses the disk and the CPU when
// nothing else does; residency is mincore(2) over a
// read-only mapping, which maps no page in; Drop is
// posix_fadvise(POSIX_FADV_DONTNEED), which drops only clean pages no
// process has mapped. It owns no goroutine.
package pagecache

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Chunk is how much one readahead asks for: a cancelled warm stops within
// one chunk, and the idle-priority I/O queues behind an engine's reads in
// pieces of this size.
const Chunk = 8 << 20

// mincoreWindow bounds one mapping of the residency check, so that a
// 100 GiB file needs neither 100 GiB of address space at once nor a
// 25 MiB vector.
const mincoreWindow = 1 << 30

// ioprio_get(2) and ioprio_set(2)'s constants (linux/ioprio.h). x/sys has only the syscall
// numbers of ioprio_set, mincore and readahead (the build is for 64-bit
// Linux: readahead's offset is one register).
const (
	ioprioWhoProcess = 1
	ioprioClassIdle  = 3
	ioprioClassShift = 13
)

// Cache is the host's page cache. Its zero value is ready.
type Cache struct {
	// Rate paces Warm, in bytes per second (0: as fast as the disk):
	// the kernel's share of reading a file in (page allocation, I/O
	// completion) is CPU that no priority keeps from a busy host's
	// requests, so it is spread thin.
	Rate int64
}

// Resident returns how many bytes of the file at path are in the page
// cache, and its size.
func (Cache) Resident(path string) (resident, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size = fi.Size()
	page := int64(os.Getpagesize())
	for off := int64(0); off < size; off += mincoreWindow {
		n := min(size-off, mincoreWindow)
		r, err := residentRange(int(f.Fd()), off, n, page)
		if err != nil {
			return 0, size, fmt.Errorf("residency of %s: %w", path, err)
		}
		resident += r
	}
	return min(resident, size), size, nil
}

// residentRange counts the resident bytes of [off, off+n); off is a
// multiple of the page size. The last page counts whole, so the caller
// caps the total at the file's size.
func residentRange(fd int, off, n, page int64) (int64, error) {
	m, err := unix.Mmap(fd, off, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (n+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, fmt.Errorf("mincore: %w", e)
	}
	var pages int64
	for _, v := range vec {
		pages += int64(v & 1)
	}
	return pages * page, nil
}

// Warm reads the file at path into the page cache, a Chunk at a time
// (paced to Rate), at idle I/O and CPU priority, and returns when every chunk was asked for (the
// reads may still complete after it returns) or ctx ended. Pages already
// resident cost the kernel a lookup only, so warming a warm file again
// is cheap.
func (c Cache) Warm(ctx context.Context, path string) error {
	// I/O and CPU priorities are the thread's: they are set on a locked
	// thread and put back before the thread is unlocked. The thread must
	// not be left to exit instead: an engine the exec supervisor forked
	// from it would get its Pdeathsig.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Best effort, both: without them warming still runs, at the
	// thread's priorities. SCHED_IDLE because readahead allocates and
	// inserts the pages on the calling thread: CPU that a request on a
	// busy host should have first.
	old, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, 0, 0)
	if e == 0 {
		if _, _, e := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, ioprioClassIdle<<ioprioClassShift); e == 0 {
			defer unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, old)
		}
	}
	if sched, err := unix.SchedGetAttr(0, 0); err == nil {
		idle := *sched
		idle.Policy, idle.Nice, idle.Priority = unix.SCHED_IDLE, 0, 0
		if unix.SchedSetAttr(0, &idle, 0) == nil {
			defer unix.SchedSetAttr(0, sched, 0)
		}
	}
	return c.warm(ctx, path)
}

func (c Cache) warm(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	// readahead(2) is a hint: it reads at most the device's readahead
	// window or I/O size per call (read_ahead_kb, max_sectors_kb) and
	// skips pages it cannot allocate at once. A chunk it left short is
	// read with pread, which reads it all; so is every chunk on a
	// filesystem without readahead (EINVAL).
	var buf []byte
	noReadahead := false
	page := int64(os.Getpagesize())
	fd := int(f.Fd())
	start := time.Now()
	for off := int64(0); off < fi.Size(); off += Chunk {
		if c.Rate > 0 {
			due := start.Add(time.Duration(float64(off) / float64(c.Rate) * float64(time.Second)))
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(due)):
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(fi.Size()-off, Chunk)
		if !noReadahead {
			_, _, e := unix.Syscall(unix.SYS_READAHEAD, uintptr(fd), uintptr(off), uintptr(n))
			switch {
			case e == unix.EINVAL:
				noReadahead = true
			case e != 0:
				return fmt.Errorf("readahead %s: %w", path, e)
			}
		}
		if !noReadahead {
			r, err := residentRange(fd, off, n, page)
			if err != nil {
				return fmt.Errorf("residency of %s: %w", path, err)
			}
			if r >= n {
				continue
			}
		}
		if buf == nil {
			buf = make([]byte, Chunk)
		}
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
	}
	return nil
}

// Drop asks the kernel to drop the file's clean pages from the page
// cache. Pages another process has mapped, or dirty ones, stay.
func (Cache) Drop(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise %s: %w", path, err)
	}
	return nil
}
