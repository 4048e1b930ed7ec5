//go:build !race

package h1

import (
	"syscall"
	"unsafe"
)

// The system calls of sockIO and of the peek before a connection's reuse,
// raw: on a non-blocking socket none of them blocks, so they need nothing
// of what the runtime's entersyscall does (sockio.go says why it costs).
// len(p) > 0.

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}

// sysPeek looks at the next byte to read without taking it, and without
// waiting: EAGAIN when there is none yet.
func sysPeek(fd uintptr, p []byte) syscall.Errno {
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return e
}
