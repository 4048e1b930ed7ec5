package h1

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// sockIO reads and writes a connection's socket with raw system calls,
// waiting for readiness on Go's netpoller as net.Conn does (deadlines and
// Close included).
//
// net.Conn's Read and Write enter each system call through the runtime's
// entersyscall, which wakes the runtime's monitor thread (sysmon) whenever
// it had gone to sleep because the process was idle. A proxy at one
// connection goes idle twice per request (waiting for the engine, then for
// the client), so each request paid a futex wake and two thread switches
// of that thread, on its critical path: on the bench machine, about four
// thread switches per request instead of two, and a third more CPU per
// request. The socket is non-blocking, so its read and write return at
// once (EAGAIN when they would block, then the netpoller waits): they
// need none of what entersyscall does for a call that may block.
//
// A read and a write may run at once (one of each, as on a net.Conn).
type sockIO struct {
	nc          net.Conn
	rc          syscall.RawConn
	r, w        sockOp
	read, write func(fd uintptr) bool
}

// sockOp is the read or write under way.
type sockOp struct {
	p     []byte        // its buffer
	n     int           // what it moved so far
	errno syscall.Errno // its failure (0: none)
}

// newSockIO is nc's sockIO, nil for a connection without a socket of its
// own (net.Pipe, a TLS connection).
func newSockIO(nc net.Conn) *sockIO {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &sockIO{nc: nc, rc: rc}
	s.read, s.write = s.readFd, s.writeFd // made once: a method value allocates
	return s
}

// readFd reads once into s.r.p; false: nothing to read yet.
func (s *sockIO) readFd(fd uintptr) bool {
	r := &s.r
	for {
		n, e := sysRead(fd, r.p)
		switch e {
		case 0:
			r.n = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		r.errno = e
		return true
	}
}

// writeFd writes what is left of s.w.p; false: the socket's buffer is
// full.
func (s *sockIO) writeFd(fd uintptr) bool {
	w := &s.w
	for w.n < len(w.p) {
		n, e := sysWrite(fd, w.p[w.n:])
		switch e {
		case 0:
			w.n += n
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			w.errno = e
			return true
		}
	}
	return true
}

func (s *sockIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.r = sockOp{p: p}
	err := s.rc.Read(s.read)
	n, errno := s.r.n, s.r.errno
	s.r.p = nil
	switch {
	case err != nil:
		return 0, s.opError("read", err)
	case errno != 0:
		return 0, s.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (s *sockIO) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.w = sockOp{p: p}
	err := s.rc.Write(s.write)
	n, errno := s.w.n, s.w.errno
	s.w.p = nil
	switch {
	case err != nil:
		return n, s.opError("write", err)
	case errno != 0:
		return n, s.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// opError is err as net.Conn's Read or Write would return it: RawConn's
// own errors (a deadline, a closed connection) come as a "raw-read" or
// "raw-write" *net.OpError, made for this call.
func (s *sockIO) opError(op string, err error) error {
	if oe, ok := errors.AsType[*net.OpError](err); ok {
		oe.Op = op
		return oe
	}
	return &net.OpError{Op: op, Net: s.nc.LocalAddr().Network(), Source: s.nc.LocalAddr(), Addr: s.nc.RemoteAddr(), Err: err}
}
