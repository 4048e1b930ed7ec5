package engine_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/napd/napd/engine"
	"github.com/napd/napd/engine/wire"
)

// worker is a configurable test worker.
type worker struct {
	mu        sync.Mutex
	readiness engine.Readiness
	failure   string
	submit    func(ctx context.Context, body []byte) engine.Reply
}

func (w *worker) Readiness() engine.Readiness {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readiness
}

func (w *worker) Failure() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failure
}

func (w *worker) Submit(body []byte, _ time.Time) engine.Reply {
	return w.SubmitContext(context.Background(), body)
}

func (w *worker) SubmitContext(ctx context.Context, body []byte) engine.Reply {
	return w.submit(ctx, body)
}

func (w *worker) Report() engine.Report {
	return engine.Report{Depth: engine.Measured(2), Rejected: engine.Measured(5)}
}

func echoWorker() *worker {
	return &worker{
		readiness: engine.Readiness{State: engine.Ready},
		submit: func(_ context.Context, body []byte) engine.Reply {
			return engine.Answered(body, "text/plain")
		},
	}
}

// serve runs w at a fresh ipc address until the test ends.
func serve(t *testing.T, w engine.Worker) string {
	t.Helper()
	addr := "ipc://" + filepath.Join(t.TempDir(), "w.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- engine.Serve(ctx, w, addr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return addr
}

// peer is a raw napd-side socket speaking the wire protocol by hand.
type peer struct {
	t    *testing.T
	sock zmq4.Socket
	in   chan wire.Message
}

func dialPeer(t *testing.T, addr, id string) *peer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity(id)))
	if err := sock.Dial(addr); err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	p := &peer{t: t, sock: sock, in: make(chan wire.Message, 64)}
	go func() {
		for {
			m, err := sock.Recv()
			if err != nil {
				return
			}
			dm, err := wire.Decode(m.Frames[0])
			if err != nil {
				t.Errorf("peer decode: %v", err)
				return
			}
			p.in <- dm
		}
	}()
	t.Cleanup(func() { cancel(); sock.Close() })
	return p
}

func (p *peer) send(m wire.Message) {
	p.t.Helper()
	frame, err := wire.Encode(m)
	if err != nil {
		p.t.Fatal(err)
	}
	p.sendRaw(frame)
}

func (p *peer) sendRaw(frame []byte) {
	p.t.Helper()
	if err := p.sock.Send(zmq4.NewMsg(frame)); err != nil {
		p.t.Fatal(err)
	}
}

// next returns the next message that is not a heartbeat answer.
func (p *peer) next() wire.Message {
	p.t.Helper()
	for {
		select {
		case m := <-p.in:
			switch m.(type) {
			case *wire.Readiness, *wire.Report:
				continue
			}
			return m
		case <-time.After(5 * time.Second):
			p.t.Fatal("no message from the worker within 5s")
			return nil
		}
	}
}

// nextOf waits for a message of type T, skipping others.
func nextOf[T wire.Message](p *peer) T {
	p.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m := <-p.in:
			if v, ok := m.(T); ok {
				return v
			}
		case <-deadline:
			var zero T
			p.t.Fatalf("no %T from the worker within 5s", zero)
			return zero
		}
	}
}

func (p *peer) hello(deadAfter time.Duration) {
	p.t.Helper()
	p.send(&wire.Hello{MinVersion: wire.MinVersion, MaxVersion: wire.MaxVersion, Software: "test", DeadAfterMillis: uint32(deadAfter.Milliseconds())})
	h, ok := p.next().(*wire.Hello)
	if !ok || h.Software != engine.Software {
		p.t.Fatalf("want the worker's hello, got %+v", h)
	}
}

func TestServe_AnswersASubmit(t *testing.T) {
	p := dialPeer(t, serve(t, echoWorker()), "napd-a")
	p.hello(0)
	p.send(&wire.Submit{ID: 1, Body: []byte("ping")})
	a, ok := p.next().(*wire.Answer)
	if !ok || a.ID != 1 || string(a.Body) != "ping" || a.ContentType != "text/plain" {
		t.Fatalf("got %+v", a)
	}
}

func TestServe_HeartbeatAnswersReadinessAndReport(t *testing.T) {
	w := echoWorker()
	w.readiness = engine.Readiness{State: engine.NotReady, Reason: "loading"}
	p := dialPeer(t, serve(t, w), "napd-a")
	p.hello(0)
	p.send(&wire.Heartbeat{})
	r := nextOf[*wire.Readiness](p)
	if r.State != wire.StateNotReady || r.Reason != "loading" {
		t.Fatalf("got %+v", r)
	}
	rep := nextOf[*wire.Report](p)
	if rep.Depth == nil || *rep.Depth != 2 || rep.Capacity != nil || *rep.Rejected != 5 {
		t.Fatalf("got %+v", rep)
	}
}

func TestServe_UnreadyWorkerNeverSeesTheRequest(t *testing.T) {
	for _, c := range []struct {
		name      string
		readiness engine.Readiness
		failure   string
		want      string
	}{
		{"loading", engine.Readiness{State: engine.NotReady, Reason: "loading"}, "", "worker is not ready: loading"},
		{"failed", engine.Readiness{State: engine.Failed, Reason: "bad weights"}, "", "worker is failed: bad weights"},
		{"failer overrides", engine.Readiness{State: engine.Ready}, "loader died", "worker is failed: loader died"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := echoWorker()
			w.readiness, w.failure = c.readiness, c.failure
			w.submit = func(context.Context, []byte) engine.Reply {
				t.Error("an unready worker was sent work")
				return engine.Answered(nil, "")
			}
			p := dialPeer(t, serve(t, w), "napd-a")
			p.hello(0)
			p.send(&wire.Submit{ID: 1})
			r, ok := p.next().(*wire.Refusal)
			if !ok || r.Kind != wire.KindNoRoom || r.Message != c.want {
				t.Fatalf("got %+v", r)
			}
		})
	}
}

func TestServe_DeadlineRefusal(t *testing.T) {
	w := echoWorker()
	started := make(chan struct{}, 1)
	w.submit = func(ctx context.Context, _ []byte) engine.Reply {
		started <- struct{}{}
		return make(chan engine.Part) // never answers
	}
	p := dialPeer(t, serve(t, w), "napd-a")
	p.hello(0)
	p.send(&wire.Submit{ID: 1, Deadline: time.Now().Add(-time.Second).UnixNano()})
	if r, ok := p.next().(*wire.Refusal); !ok || r.Kind != wire.KindDeadline {
		t.Fatalf("past deadline: got %+v", r)
	}
	p.send(&wire.Submit{ID: 2, Deadline: time.Now().Add(100 * time.Millisecond).UnixNano()})
	<-started
	if r, ok := p.next().(*wire.Refusal); !ok || r.ID != 2 || r.Kind != wire.KindDeadline {
		t.Fatalf("deadline during work: got %+v", r)
	}
}

func TestServe_CancelReachesTheWorker(t *testing.T) {
	w := echoWorker()
	cancelled := make(chan error, 1)
	w.submit = func(ctx context.Context, _ []byte) engine.Reply {
		out := make(chan engine.Part)
		go func() {
			defer close(out)
			<-ctx.Done()
			cancelled <- ctx.Err()
			out <- engine.Part{Answer: &engine.Answer{}} // nobody wants it; Serve drains
		}()
		return out
	}
	p := dialPeer(t, serve(t, w), "napd-a")
	p.hello(0)
	p.send(&wire.Submit{ID: 1})
	p.send(&wire.Cancel{ID: 1})
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ctx error %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the worker never learned of the cancel")
	}
	// The session goes on: a new request is answered.
	w.mu.Lock()
	w.submit = echoWorker().submit
	w.mu.Unlock()
	p.send(&wire.Submit{ID: 2, Body: []byte("x")})
	if a, ok := p.next().(*wire.Answer); !ok || a.ID != 2 {
		t.Fatalf("got %+v", a)
	}
}

func TestServe_StreamsChunksThenTheFinal(t *testing.T) {
	w := echoWorker()
	w.submit = func(context.Context, []byte) engine.Reply {
		out := make(chan engine.Part, 3)
		out <- engine.Part{Chunk: &engine.Chunk{Data: []byte("a"), ContentType: "text/event-stream"}}
		out <- engine.Part{Chunk: &engine.Chunk{Data: []byte("b")}}
		out <- engine.Part{Answer: &engine.Answer{Body: []byte("c")}}
		close(out)
		return out
	}
	p := dialPeer(t, serve(t, w), "napd-a")
	p.hello(0)
	p.send(&wire.Submit{ID: 5})
	c1, _ := p.next().(*wire.Chunk)
	c2, _ := p.next().(*wire.Chunk)
	a, _ := p.next().(*wire.Answer)
	if c1 == nil || c2 == nil || a == nil || string(c1.Data)+string(c2.Data)+string(a.Body) != "abc" || c1.ContentType != "text/event-stream" {
		t.Fatalf("got %+v %+v %+v", c1, c2, a)
	}
}

func TestServe_WorkerBugsBecomeInferenceFailed(t *testing.T) {
	w := echoWorker()
	w.submit = func(_ context.Context, body []byte) engine.Reply {
		if string(body) == "nil" {
			return nil
		}
		out := make(chan engine.Part)
		close(out)
		return out
	}
	p := dialPeer(t, serve(t, w), "napd-a")
	p.hello(0)
	for i, body := range []string{"nil", "closed"} {
		p.send(&wire.Submit{ID: uint64(i + 1), Body: []byte(body)})
		if r, ok := p.next().(*wire.Refusal); !ok || r.Kind != wire.KindInferenceFailed {
			t.Fatalf("%s: got %+v", body, r)
		}
	}
}

func TestServe_SecondPeerIsRefused(t *testing.T) {
	addr := serve(t, echoWorker())
	first := dialPeer(t, addr, "napd-a")
	first.hello(0)
	second := dialPeer(t, addr, "napd-b")
	second.send(&wire.Hello{MinVersion: 1, MaxVersion: 1})
	e, ok := second.next().(*wire.Error)
	if !ok || !strings.Contains(e.Message, "already serves another napd") {
		t.Fatalf("got %+v", e)
	}
	// The first session is undisturbed.
	first.send(&wire.Submit{ID: 1, Body: []byte("still here")})
	if a, ok := first.next().(*wire.Answer); !ok || string(a.Body) != "still here" {
		t.Fatalf("got %+v", a)
	}
	// A non-hello from a peer with no session is refused too.
	second.send(&wire.Submit{ID: 1})
	if e, ok := second.next().(*wire.Error); !ok || !strings.Contains(e.Message, "send hello first") {
		t.Fatalf("got %+v", e)
	}
}

func TestServe_SilentNapdIsReplaced(t *testing.T) {
	addr := serve(t, echoWorker())
	first := dialPeer(t, addr, "napd-a")
	first.hello(100 * time.Millisecond)
	// first now stays silent; second is refused until first's DeadAfter
	// has passed, then takes over.
	second := dialPeer(t, addr, "napd-b")
	deadline := time.Now().Add(5 * time.Second)
	for {
		second.send(&wire.Hello{MinVersion: 1, MaxVersion: 1})
		if _, ok := second.next().(*wire.Hello); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the silent first napd was never replaced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	second.send(&wire.Submit{ID: 1, Body: []byte("b")})
	if a, ok := second.next().(*wire.Answer); !ok || string(a.Body) != "b" {
		t.Fatalf("got %+v", a)
	}
}

func TestServe_VersionMismatchIsLoud(t *testing.T) {
	p := dialPeer(t, serve(t, echoWorker()), "napd-a")
	p.send(&wire.Hello{MinVersion: 7, MaxVersion: 9, Software: "napd-future"})
	if h, ok := p.next().(*wire.Hello); !ok || h.MaxVersion != wire.MaxVersion {
		t.Fatalf("want the worker's range first, got %+v", h)
	}
	e, ok := p.next().(*wire.Error)
	if !ok || !strings.Contains(e.Message, "napd speaks protocol 7–9, worker speaks 1: upgrade worker") {
		t.Fatalf("got %+v", e)
	}
}

func TestServe_UnknownMessageTypeIsRejected(t *testing.T) {
	p := dialPeer(t, serve(t, echoWorker()), "napd-a")
	p.hello(0)
	p.sendRaw([]byte{0x6e, 0x90})
	e, ok := p.next().(*wire.Error)
	if !ok || !strings.Contains(e.Message, "unknown message type 0x6e") {
		t.Fatalf("got %+v", e)
	}
	p.send(&wire.Answer{ID: 1})
	if e, ok := p.next().(*wire.Error); !ok || !strings.Contains(e.Message, "not for a worker") {
		t.Fatalf("got %+v", e)
	}
}

func TestServe_ToleratesTrailingFieldsFromANewerNapd(t *testing.T) {
	p := dialPeer(t, serve(t, echoWorker()), "napd-a")
	p.hello(0)
	// A Submit with a fifth field this build does not know.
	frame := []byte{byte(wire.TypeSubmit), 0x95, 0x01, 0x00, 0xa0, 0xc4, 0x02, 'h', 'i', 0xa5, 'e', 'x', 't', 'r', 'a'}
	p.sendRaw(frame)
	if a, ok := p.next().(*wire.Answer); !ok || string(a.Body) != "hi" {
		t.Fatalf("got %+v", a)
	}
}

func TestServe_RemovesAStaleSocketButNotALiveOne(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	err = engine.Serve(context.Background(), echoWorker(), "ipc://"+path)
	if err == nil || !strings.Contains(err.Error(), "another process listens") {
		t.Fatalf("live socket: got %v", err)
	}
	// Closing a listener removes its file; recreate a stale one by hand.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("want a stale socket file: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := engine.Serve(ctx, echoWorker(), "ipc://"+path); err != nil {
		t.Fatalf("stale socket: %v", err)
	}
}
