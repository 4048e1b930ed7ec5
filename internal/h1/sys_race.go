//go:build race

package h1

import "syscall"

// Under the race detector, sockIO's system calls go through the syscall
// package's own Read, Write and Recvfrom: those tell the detector that
// what a goroutine did before writing to a socket happened before what
// another does after reading it, which raw calls do not (tests that order
// goroutines through a connection would report races that are none).

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errno(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errno(err)
}

func sysPeek(fd uintptr, p []byte) syscall.Errno {
	_, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return errno(err)
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
