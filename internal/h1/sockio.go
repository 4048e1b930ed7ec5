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
	n, err := s.do(&s.r, p, false)
	if n == 0 && err == nil && len(p) > 0 {
		return 0, io.EOF
	}
	return n, err
}

func (s *sockIO) Write(p []byte) (int, error) { return s.do(&s.w, p, true) }

// do reads into p (writes p) as o, waiting on the netpoller for the
// socket to be ready.
func (s *sockIO) do(o *sockOp, p []byte, write bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	*o = sockOp{p: p}
	op, err := "read", error(nil)
	if write {
		op, err = "write", s.rc.Write(s.write)
	} else {
		err = s.rc.Read(s.read)
	}
	n, errno := o.n, o.errno
	o.p = nil
	switch {
	case err != nil:
		return n, s.opError(op, err)
	case errno != 0:
		return n, s.opError(op, os.NewSyscallError(op, errno))
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
