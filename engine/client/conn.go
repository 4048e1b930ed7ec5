package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/napd/napd/engine"
	"github.com/napd/napd/engine/wire"
)

// conn is one session over one socket. It dies once, and is then replaced
// by a new conn (new socket, same identity).
type conn struct {
	client  *Client
	sock    zmq4.Socket
	stop    context.CancelFunc
	version uint32

	in     chan zmq4.Msg
	rxDone chan struct{} // closed when receiving fails; rxErr says why
	rxErr  error

	lastHeard atomic.Int64 // Unix nanoseconds of the last message from the worker
	sendMu    sync.Mutex

	dieOnce sync.Once
	dead    chan struct{} // closed by die; deadErr is set before
	deadErr *DeadError

	seq atomic.Uint64 // last heartbeat sequence number sent

	mu      sync.Mutex
	calls   map[uint64]*call
	waiters []waiter
	depth   *uint64 // from the last Report; nil: not measured
}

// receive feeds socket messages to in until the socket fails or ctx ends.
func (cn *conn) receive(ctx context.Context) {
	for {
		zm, err := cn.sock.Recv()
		if err != nil {
			cn.rxErr = err
			close(cn.rxDone)
			return
		}
		select {
		case cn.in <- zm:
		case <-ctx.Done():
			return
		}
	}
}

// start runs the session after the handshake.
func (cn *conn) start() {
	go cn.dispatch()
	go cn.heartbeat()
}

// errSessionDead is send's refusal on a session already declared dead:
// nothing was written, so the worker cannot have seen the message.
var errSessionDead = errors.New("session is dead")

func (cn *conn) send(m wire.Message) error {
	frame, err := wire.Encode(m)
	if err != nil {
		return err
	}
	cn.sendMu.Lock()
	defer cn.sendMu.Unlock()
	select {
	case <-cn.dead:
		return errSessionDead
	default:
	}
	return cn.sock.Send(zmq4.NewMsg(frame))
}

// die ends the session: every call in flight fails with the *DeadError.
func (cn *conn) die(reason string) {
	cn.dieOnce.Do(func() {
		cn.deadErr = &DeadError{Address: cn.client.address, Reason: reason}
		cn.client.detach(cn)
		close(cn.dead)
		cn.stop()
		cn.sock.Close()
		cn.client.lost(cn.deadErr)
	})
}

func (cn *conn) dispatch() {
	for {
		select {
		case <-cn.dead:
			return
		case <-cn.rxDone:
			cn.die(fmt.Sprintf("connection lost: %v", cn.rxErr))
			return
		case zm := <-cn.in:
			cn.lastHeard.Store(time.Now().UnixNano())
			m, err := decodeOne(zm)
			if err != nil {
				cn.reject(fmt.Sprintf("napd cannot read message: %v", err))
				return
			}
			if !cn.handle(m) {
				return
			}
		}
	}
}

// reject tells the worker loudly why the session ends, and ends it.
func (cn *conn) reject(reason string) {
	cn.client.log.Error("engine worker broke the protocol", "reason", reason)
	_ = cn.send(&wire.Error{Message: reason})
	cn.die("protocol error: " + reason)
}

// handle processes one message; false means the session ended.
func (cn *conn) handle(m wire.Message) bool {
	switch m := m.(type) {
	case *wire.Chunk:
		cn.deliver(m.ID, m, false)
	case *wire.Answer:
		cn.deliver(m.ID, m, true)
	case *wire.Refusal:
		cn.deliver(m.ID, m, true)
	case *wire.Readiness:
		r := engine.Readiness{State: engine.State(m.State), Reason: m.Reason}
		cn.mu.Lock()
		kept := cn.waiters[:0]
		for _, w := range cn.waiters {
			if m.Seq >= w.seq {
				w.ch <- r
			} else {
				kept = append(kept, w)
			}
		}
		cn.waiters = kept
		cn.mu.Unlock()
	case *wire.Report:
		cn.mu.Lock()
		cn.depth = m.Depth
		cn.mu.Unlock()
	case *wire.Heartbeat:
		// Liveness only; lastHeard is already updated.
	case *wire.Error:
		cn.client.log.Error("engine worker rejected napd", "reason", m.Message)
		cn.die("worker rejected napd: " + m.Message)
		return false
	default:
		cn.reject(fmt.Sprintf("message type 0x%02x is not for napd", byte(m.Type())))
		return false
	}
	return true
}

func (cn *conn) heartbeat() {
	t := time.NewTicker(cn.client.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-cn.dead:
			return
		case now := <-t.C:
			silent := now.Sub(time.Unix(0, cn.lastHeard.Load()))
			if silent > cn.client.opts.DeadAfter {
				cn.die(fmt.Sprintf("silent for %v (limit %v)", silent.Round(time.Millisecond), cn.client.opts.DeadAfter))
				return
			}
			if err := cn.ping(); err != nil {
				cn.die("send heartbeat: " + err.Error())
				return
			}
		}
	}
}

// waiter wants the first Readiness answering heartbeat seq or a later one.
type waiter struct {
	seq uint64
	ch  chan engine.Readiness
}

// ping sends a heartbeat nobody waits on.
func (cn *conn) ping() error {
	return cn.send(&wire.Heartbeat{Seq: cn.seq.Add(1)})
}

// query sends a heartbeat and returns a channel receiving the answer to it.
func (cn *conn) query() (<-chan engine.Readiness, error) {
	w := waiter{seq: cn.seq.Add(1), ch: make(chan engine.Readiness, 1)}
	cn.mu.Lock()
	cn.waiters = append(cn.waiters, w)
	cn.mu.Unlock()
	return w.ch, cn.send(&wire.Heartbeat{Seq: w.seq})
}

// queueDepth is the worker's last reported depth.
func (cn *conn) queueDepth() (uint64, bool) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.depth == nil {
		return 0, false
	}
	return *cn.depth, true
}

func (cn *conn) register(id uint64) *call {
	cl := &call{id: id, cn: cn, signal: make(chan struct{}, 1)}
	cn.mu.Lock()
	cn.calls[id] = cl
	cn.mu.Unlock()
	return cl
}

func (cn *conn) deliver(id uint64, m wire.Message, final bool) {
	cn.mu.Lock()
	cl := cn.calls[id]
	if final {
		delete(cn.calls, id)
	}
	cn.mu.Unlock()
	if cl != nil {
		cl.push(m)
	}
	// A reply to a call nobody waits for any more (cancelled) is dropped.
}

// forget drops call id; when the worker still owes it a reply, it is told
// to stop.
func (cn *conn) forget(id uint64) {
	cn.mu.Lock()
	_, pending := cn.calls[id]
	delete(cn.calls, id)
	cn.mu.Unlock()
	if pending {
		if err := cn.send(&wire.Cancel{ID: id}); err != nil {
			cn.client.log.Debug("engine cancel not sent", "id", id, "err", err)
		}
	}
}

// call is one request in flight. Its queue is unbounded so a slow HTTP
// reader never stalls the session's single receiving goroutine.
type call struct {
	id     uint64
	cn     *conn
	mu     sync.Mutex
	queue  []wire.Message
	signal chan struct{}
}

func (cl *call) push(m wire.Message) {
	cl.mu.Lock()
	cl.queue = append(cl.queue, m)
	cl.mu.Unlock()
	select {
	case cl.signal <- struct{}{}:
	default:
	}
}

// next returns the call's next message, the session's *DeadError, or
// ctx's error. Messages already received come before a death.
func (cl *call) next(ctx context.Context) (wire.Message, error) {
	for {
		cl.mu.Lock()
		if len(cl.queue) > 0 {
			m := cl.queue[0]
			cl.queue = cl.queue[1:]
			cl.mu.Unlock()
			return m, nil
		}
		cl.mu.Unlock()
		select {
		case <-cl.signal:
		case <-cl.cn.dead:
			cl.mu.Lock()
			n := len(cl.queue)
			cl.mu.Unlock()
			if n == 0 {
				return nil, cl.cn.deadErr
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
