package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/napd/napd/engine/ipcsock"
	"github.com/napd/napd/engine/wire"
)

// Option changes how Serve runs.
type Option func(*server)

// WithLogger sets Serve's logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *server) {
		if l != nil {
			s.log = l
		}
	}
}

// Software is the name Serve gives in its handshake.
const Software = "napd-engine-go"

// sendTimeout bounds one socket send, so a wedged peer cannot stall the
// loop for zmq4's default five minutes.
const sendTimeout = 10 * time.Second

// sessionCheck is how often Serve looks for a napd gone silent.
const sessionCheck = 100 * time.Millisecond

// Serve runs w behind a ROUTER socket bound at address (ipc://… on the same
// host) until ctx ends, then returns nil; it returns an error if the socket
// cannot be bound or fails.
//
// One napd at a time: the first peer to say hello owns the session; another
// peer's hello is refused with an Error while the owner is alive (heard from
// within the DeadAfter it announced). The owner reconnecting with the same
// identity, or any peer after the owner went silent, starts a new session
// and cancels the old one's requests.
func Serve(ctx context.Context, w Worker, address string, opts ...Option) error {
	s := &server{w: w, address: address, log: slog.Default(), out: make(chan outbound)}
	for _, o := range opts {
		o(s)
	}
	if err := ipcsock.RemoveStale(address); err != nil {
		return fmt.Errorf("serve %s: %w", address, err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s.stopped = sctx.Done()
	s.sock = zmq4.NewRouter(sctx, zmq4.WithTimeout(sendTimeout), zmq4.WithLogger(discardLogger()))
	if err := s.sock.Listen(address); err != nil {
		return fmt.Errorf("serve %s: %w", address, err)
	}
	defer s.sock.Close()
	s.log.Info("engine worker listening", "address", address)
	return s.loop(sctx)
}

type server struct {
	w       Worker
	address string
	log     *slog.Logger
	sock    zmq4.Socket
	out     chan outbound   // replies from request goroutines, sent by the loop
	stopped <-chan struct{} // closed when Serve returns
	sess    *session        // owned by loop
}

// session is the state of one napd peer.
type session struct {
	peer      []byte
	deadAfter time.Duration // 0: never expires
	lastHeard time.Time
	ctx       context.Context
	end       context.CancelFunc
	reqs      map[uint64]context.CancelFunc
}

// outbound is a request goroutine's message for the loop to send; a final
// one also ends the request, and a nil msg only ends it.
type outbound struct {
	sess  *session
	id    uint64
	msg   wire.Message
	final bool
}

type inbound struct {
	msg zmq4.Msg
	err error
}

func (s *server) loop(ctx context.Context) error {
	in := make(chan inbound)
	go func() {
		for {
			m, err := s.sock.Recv()
			select {
			case in <- inbound{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(sessionCheck)
	defer tick.Stop()
	defer s.endSession("worker stopping")
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-in:
			if r.err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("serve %s: receive: %w", s.address, r.err)
			}
			s.handle(r.msg)
		case o := <-s.out:
			if o.sess != s.sess {
				continue // the session ended; nobody wants this
			}
			if o.final {
				delete(o.sess.reqs, o.id)
			}
			if o.msg != nil {
				s.send(o.sess.peer, o.msg)
			}
		case now := <-tick.C:
			if s.sess != nil && s.sess.deadAfter > 0 && now.Sub(s.sess.lastHeard) > s.sess.deadAfter {
				s.endSession("napd silent")
			}
		}
	}
}

func (s *server) send(peer []byte, m wire.Message) {
	frame, err := wire.Encode(m)
	if err == nil {
		err = s.sock.SendMulti(zmq4.NewMsgFrom(peer, frame))
	}
	if err != nil {
		s.log.Warn("engine worker send failed", "type", m.Type(), "err", err)
	}
}

func (s *server) reject(peer []byte, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.Error("engine worker rejected a peer message", "reason", msg)
	s.send(peer, &wire.Error{Message: msg})
}

func (s *server) handle(zm zmq4.Msg) {
	if len(zm.Frames) != 2 {
		if len(zm.Frames) > 0 {
			s.reject(zm.Frames[0], "want one frame per message, got %d", len(zm.Frames)-1)
		}
		return
	}
	peer, frame := zm.Frames[0], zm.Frames[1]
	m, err := wire.Decode(frame)
	if err != nil {
		s.reject(peer, "worker cannot read message: %v", err)
		return
	}
	if h, ok := m.(*wire.Hello); ok {
		s.hello(peer, h)
		return
	}
	if s.sess == nil || string(s.sess.peer) != string(peer) {
		s.reject(peer, "no session: send hello first")
		return
	}
	s.sess.lastHeard = time.Now()
	switch m := m.(type) {
	case *wire.Heartbeat:
		s.status(peer, m.Seq)
	case *wire.Submit:
		s.submit(m)
	case *wire.Cancel:
		if cancel, ok := s.sess.reqs[m.ID]; ok {
			cancel()
		}
	case *wire.Error:
		s.log.Error("napd rejected a worker message", "reason", m.Message)
	default:
		s.reject(peer, "message type 0x%02x is not for a worker", byte(m.Type()))
	}
}

func (s *server) hello(peer []byte, h *wire.Hello) {
	if s.sess != nil && string(s.sess.peer) != string(peer) &&
		(s.sess.deadAfter == 0 || time.Since(s.sess.lastHeard) <= s.sess.deadAfter) {
		s.reject(peer, "worker at %s already serves another napd: one peer per worker", s.address)
		return
	}
	s.send(peer, &wire.Hello{MinVersion: wire.MinVersion, MaxVersion: wire.MaxVersion, Software: Software})
	if _, err := wire.Negotiate(wire.Local, wire.Range{Min: h.MinVersion, Max: h.MaxVersion}, "worker", "napd"); err != nil {
		s.reject(peer, "%v", err)
		return
	}
	s.endSession("new session")
	ctx, end := context.WithCancel(context.Background())
	s.sess = &session{
		peer:      peer,
		deadAfter: time.Duration(h.DeadAfterMillis) * time.Millisecond,
		lastHeard: time.Now(),
		ctx:       ctx,
		end:       end,
		reqs:      make(map[uint64]context.CancelFunc),
	}
	s.log.Info("napd connected", "software", h.Software)
	s.status(peer, 0)
}

func (s *server) endSession(why string) {
	if s.sess == nil {
		return
	}
	if len(s.sess.reqs) > 0 {
		s.log.Info("engine session ended with requests in flight", "reason", why, "requests", len(s.sess.reqs))
	}
	s.sess.end()
	s.sess = nil
}

// status answers heartbeat seq: readiness, then the report if measured.
func (s *server) status(peer []byte, seq uint64) {
	r := readiness(s.w)
	s.send(peer, &wire.Readiness{State: uint8(r.State), Reason: r.Reason, Seq: seq})
	if rep, ok := s.w.(Reporter); ok {
		q := rep.Report()
		s.send(peer, &wire.Report{Depth: q.Depth, Capacity: q.Capacity, Rejected: q.Rejected})
	}
}

func (s *server) submit(m *wire.Submit) {
	sess := s.sess
	refuse := func(kind uint8, msg string) {
		s.send(sess.peer, &wire.Refusal{ID: m.ID, Kind: kind, Message: msg})
	}
	if _, dup := sess.reqs[m.ID]; dup {
		refuse(wire.KindInvalidRequest, fmt.Sprintf("request id %d is already in flight", m.ID))
		return
	}
	var deadline time.Time
	if m.Deadline != 0 {
		deadline = time.Unix(0, m.Deadline)
		if !time.Now().Before(deadline) {
			refuse(wire.KindDeadline, "deadline passed before the worker received the request")
			return
		}
	}
	if r := readiness(s.w); r.State != Ready {
		refuse(wire.KindNoRoom, "worker is "+r.State.String()+reasonSuffix(r.Reason))
		return
	}
	var (
		ctx    context.Context
		cancel context.CancelFunc
	)
	if deadline.IsZero() {
		ctx, cancel = context.WithCancel(sess.ctx)
	} else {
		ctx, cancel = context.WithDeadline(sess.ctx, deadline)
	}
	sess.reqs[m.ID] = cancel
	go s.run(ctx, cancel, sess, m.ID, m.Body, deadline)
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

// run calls the worker for one request and relays its reply to the loop.
func (s *server) run(ctx context.Context, cancel context.CancelFunc, sess *session, id uint64, body []byte, deadline time.Time) {
	defer cancel()
	var reply Reply
	if cs, ok := s.w.(ContextSubmitter); ok {
		reply = cs.SubmitContext(ctx, body)
	} else {
		reply = s.w.Submit(body, deadline)
	}
	if reply == nil {
		s.emit(sess, id, &wire.Refusal{ID: id, Kind: wire.KindInferenceFailed, Message: "worker returned no reply"}, true)
		return
	}
	for {
		select {
		case p, ok := <-reply:
			if !ok {
				s.emit(sess, id, &wire.Refusal{ID: id, Kind: wire.KindInferenceFailed, Message: "worker closed its reply without an answer"}, true)
				return
			}
			m, final := toWire(id, p)
			if m == nil {
				continue // an empty Part says nothing
			}
			s.emit(sess, id, m, final)
			if final {
				go drain(reply)
				return
			}
		case <-ctx.Done():
			// A cancelled request needs no reply, only forgetting (nil msg).
			var m wire.Message
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				m = &wire.Refusal{ID: id, Kind: wire.KindDeadline, Message: "the worker did not answer within the deadline"}
			}
			s.emit(sess, id, m, true)
			go drain(reply)
			return
		}
	}
}

// drain empties a reply nobody wants, so its worker never blocks sending.
func drain(r Reply) {
	for range r {
	}
}

func toWire(id uint64, p Part) (m wire.Message, final bool) {
	switch {
	case p.Answer != nil:
		return &wire.Answer{ID: id, ContentType: p.Answer.ContentType, Body: p.Answer.Body}, true
	case p.Refusal != nil:
		return &wire.Refusal{ID: id, Kind: uint8(p.Refusal.Kind), Message: p.Refusal.Message}, true
	case p.Chunk != nil:
		return &wire.Chunk{ID: id, ContentType: p.Chunk.ContentType, Data: p.Chunk.Data}, false
	}
	return nil, false
}

func (s *server) emit(sess *session, id uint64, m wire.Message, final bool) {
	select {
	case s.out <- outbound{sess: sess, id: id, msg: m, final: final}:
	case <-s.stopped:
	}
}
