package gateway

import (
	"errors"
	"net"
	"syscall"
)

// Fault is what went wrong on the engine's side of a request, as the
// gateway saw it. The model layer acts on it: a refused connection never
// reached the engine, a connect timeout is a reason to check the engine's
// health, a cut answer is not complete.
type Fault int

// Faults.
const (
	FaultNone Fault = iota
	// FaultRefused: the engine's port refused the connection; the engine
	// never saw the request.
	FaultRefused
	// FaultConnectTimeout: the engine did not accept the connection in
	// time (a frozen engine, a full accept queue); it never saw the request.
	FaultConnectTimeout
	// FaultFailed: the connection failed after the request may have
	// reached the engine.
	FaultFailed
	// FaultCut: the engine's answer ended before it was complete (the
	// engine died or dropped the connection mid-answer).
	FaultCut
)

func (f Fault) String() string {
	switch f {
	case FaultRefused:
		return "refused"
	case FaultConnectTimeout:
		return "connect-timeout"
	case FaultFailed:
		return "failed"
	case FaultCut:
		return "cut"
	}
	return "none"
}

// Unreached reports a fault that proves the engine never saw the request.
func (f Fault) Unreached() bool { return f == FaultRefused || f == FaultConnectTimeout }

// faultOf classifies a transport error that was not the request's own
// deadline or its client leaving.
func faultOf(err error) Fault {
	var op *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return FaultRefused
	case errors.As(err, &op) && op.Op == "dial" && op.Timeout():
		return FaultConnectTimeout
	}
	return FaultFailed
}

// message is the 502's message for f, where who is the engine or remote
// the request went to (call.upstream).
func (f Fault) message(who string) string {
	switch f {
	case FaultRefused:
		return who + " refused the connection"
	case FaultConnectTimeout:
		return who + " did not accept a connection in time"
	}
	return "cannot reach " + who
}
