package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/napd/napd/engine"
	"github.com/napd/napd/engine/client"
	"github.com/napd/napd/engine/wire"
)

// helperEnv makes the test binary act as a worker process (see TestMain).
const helperEnv = "NAPD_ENGINE_TEST_WORKER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		w := newWorker()
		go func() { // tell the test each body that reached the worker
			for b := range w.received {
				fmt.Printf("%s\n", b)
			}
		}()
		if err := engine.Serve(ctx, w, addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// worker answers by body: "slow" never answers (until cancelled), "stream:N"
// streams N chunks waiting for a gate between them, "refuse:K:msg" refuses
// with kind K, anything else is echoed.
type worker struct {
	mu        sync.Mutex
	readiness engine.Readiness
	depth     *uint64
	gate      chan struct{} // stream chunks wait on it
	cancelled chan error    // slow requests report how they ended
	received  chan []byte   // every body seen
}

func newWorker() *worker {
	return &worker{
		readiness: engine.Readiness{State: engine.Ready},
		gate:      make(chan struct{}),
		cancelled: make(chan error, 8),
		received:  make(chan []byte, 64),
	}
}

func (w *worker) Readiness() engine.Readiness {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readiness
}

func (w *worker) Report() engine.Report {
	w.mu.Lock()
	defer w.mu.Unlock()
	return engine.Report{Depth: w.depth}
}

func (w *worker) Submit(body []byte, _ time.Time) engine.Reply {
	return w.SubmitContext(context.Background(), body)
}

func (w *worker) SubmitContext(ctx context.Context, body []byte) engine.Reply {
	select {
	case w.received <- body:
	default:
	}
	s := string(body)
	switch {
	case s == "slow":
		out := make(chan engine.Part)
		go func() {
			defer close(out)
			<-ctx.Done()
			w.cancelled <- ctx.Err()
		}()
		return out
	case strings.HasPrefix(s, "stream:"):
		var n int
		fmt.Sscanf(s, "stream:%d", &n)
		out := make(chan engine.Part)
		go func() {
			defer close(out)
			for i := range n {
				out <- engine.Part{Chunk: &engine.Chunk{Data: fmt.Appendf(nil, "data: %d\n\n", i), ContentType: "text/event-stream"}}
				<-w.gate
			}
			out <- engine.Part{Answer: &engine.Answer{Body: []byte("data: [DONE]\n\n")}}
		}()
		return out
	case strings.HasPrefix(s, "refuse:"):
		parts := strings.SplitN(s, ":", 3)
		var k int
		fmt.Sscanf(parts[1], "%d", &k)
		return engine.Refused(engine.RefusalKind(k), parts[2])
	}
	return engine.Answered(body, "application/json")
}

func newAddr(t *testing.T) string {
	return "ipc://" + filepath.Join(t.TempDir(), "w.sock")
}

// serve runs w in this process until the test ends.
func serve(t *testing.T, addr string, w engine.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- engine.Serve(ctx, w, addr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

var fast = client.Options{HeartbeatInterval: 50 * time.Millisecond, DeadAfter: 400 * time.Millisecond}

// dial connects to a worker that may still be starting: a race-built helper
// process (startHelper) can take many seconds to serve on a loaded machine,
// so the bound is generous; it only costs time when the test fails.
func dial(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, addr, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func post(ctx context.Context, body string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://engine/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return req
}

func readAll(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

func TestRoundTrip_Answer(t *testing.T) {
	addr := newAddr(t)
	w := newWorker()
	w.depth = engine.Measured(3)
	serve(t, addr, w)
	c := dial(t, addr, fast)
	if _, err := c.Readiness(context.Background()); err != nil { // a report has arrived
		t.Fatal(err)
	}
	resp, err := c.RoundTrip(post(context.Background(), `{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Queue-Depth") != "3" {
		t.Fatalf("got %d %v", resp.StatusCode, resp.Header)
	}
	if got := readAll(t, resp.Body); got != `{"model":"m"}` {
		t.Fatalf("body %q", got)
	}
}

func TestRoundTrip_RefusalsMapToStatuses(t *testing.T) {
	addr := newAddr(t)
	serve(t, addr, newWorker())
	c := dial(t, addr, fast)
	msg := `bad "quote" \ and <tag>` + "\n"
	for _, tc := range []struct {
		kind   engine.RefusalKind
		status int
		code   string
	}{
		{engine.NoRoom, 503, "no_room"},
		{engine.InvalidRequest, 400, "invalid_request"},
		{engine.InferenceFailed, 500, "inference_failed"},
		{engine.Deadline, 504, "deadline_exceeded"},
	} {
		resp, err := c.RoundTrip(post(context.Background(), fmt.Sprintf("refuse:%d:%s", tc.kind, msg)))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.status {
			t.Errorf("%v: status %d, want %d", tc.kind, resp.StatusCode, tc.status)
		}
		if ra := resp.Header.Get("Retry-After"); (tc.status == 503) != (ra == "1") {
			t.Errorf("%v: Retry-After %q", tc.kind, ra)
		}
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		if err := json.Unmarshal([]byte(readAll(t, resp.Body)), &e); err != nil {
			t.Fatalf("%v: body is not JSON: %v", tc.kind, err)
		}
		if e.Error.Message != msg || e.Error.Code != tc.code || e.Error.Type == "" {
			t.Errorf("%v: error %+v", tc.kind, e.Error)
		}
	}
}

func TestRoundTrip_StreamsChunksAsTheyArrive(t *testing.T) {
	addr := newAddr(t)
	w := newWorker()
	serve(t, addr, w)
	c := dial(t, addr, fast)
	resp, err := c.RoundTrip(post(context.Background(), "stream:2"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.ContentLength != -1 {
		t.Fatalf("got %d %v %d", resp.StatusCode, resp.Header, resp.ContentLength)
	}
	buf := make([]byte, 64)
	// The second chunk is held back by the gate: the first must come alone.
	n, err := resp.Body.Read(buf)
	if err != nil || string(buf[:n]) != "data: 0\n\n" {
		t.Fatalf("first read %q, %v", buf[:n], err)
	}
	w.gate <- struct{}{}
	n, err = resp.Body.Read(buf)
	if err != nil || string(buf[:n]) != "data: 1\n\n" {
		t.Fatalf("second read %q, %v", buf[:n], err)
	}
	w.gate <- struct{}{}
	if rest := readAll(t, resp.Body); rest != "data: [DONE]\n\n" {
		t.Fatalf("rest %q", rest)
	}
}

func TestRoundTrip_DeadlineIs504(t *testing.T) {
	addr := newAddr(t)
	w := newWorker()
	serve(t, addr, w)
	c := dial(t, addr, fast)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	resp, err := c.RoundTrip(post(ctx, "slow"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
	select {
	case err := <-w.cancelled:
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("worker ctx ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the worker's request never ended")
	}
}

func TestRoundTrip_ClientDisconnectCancelsOnTheWorker(t *testing.T) {
	addr := newAddr(t)
	w := newWorker()
	serve(t, addr, w)
	c := dial(t, addr, fast)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.RoundTrip(post(ctx, "slow"))
		errc <- err
	}()
	<-w.received
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("RoundTrip error %v, want Canceled", err)
	}
	select {
	case err := <-w.cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("worker ctx ended with %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel never reached the worker")
	}
}

func TestRoundTrip_ClosingAStreamCancelsOnTheWorker(t *testing.T) {
	addr := newAddr(t)
	w := newWorker()
	serve(t, addr, w)
	c := dial(t, addr, fast)
	resp, err := c.RoundTrip(post(context.Background(), "stream:3"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The worker's stream goroutine is blocked on the gate; after the
	// cancel Serve drains it, so releasing the gate must not block.
	for range 3 {
		select {
		case w.gate <- struct{}{}:
		case <-time.After(5 * time.Second):
			t.Fatal("worker stream stuck after cancel")
		}
	}
}

func TestReadiness_ReportsTheWorkersState(t *testing.T) {
	addr := newAddr(t)
	w := newWorker()
	w.readiness = engine.Readiness{State: engine.NotReady, Reason: "loading"}
	serve(t, addr, w)
	c := dial(t, addr, fast)
	r, err := c.Readiness(context.Background())
	if err != nil || r.State != engine.NotReady || r.Reason != "loading" {
		t.Fatalf("got %+v, %v", r, err)
	}
	w.mu.Lock()
	w.readiness = engine.Readiness{State: engine.Ready}
	w.mu.Unlock()
	if r, err := c.Readiness(context.Background()); err != nil || r.State != engine.Ready {
		t.Fatalf("got %+v, %v", r, err)
	}
}

func TestDial_SecondNapdIsRejected(t *testing.T) {
	addr := newAddr(t)
	serve(t, addr, newWorker())
	dial(t, addr, fast)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := client.Dial(ctx, addr, fast)
	var re *client.RejectedError
	if !errors.As(err, &re) || !strings.Contains(re.Message, "already serves another napd") {
		t.Fatalf("got %v, want *RejectedError", err)
	}
}

// fakeWorker binds a raw ROUTER and lets the test answer by hand.
func fakeWorker(t *testing.T, addr string, handle func(sock zmq4.Socket, peer []byte, m wire.Message)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewRouter(ctx)
	if err := sock.Listen(addr); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			zm, err := sock.Recv()
			if err != nil {
				return
			}
			m, err := wire.Decode(zm.Frames[1])
			if err != nil {
				t.Errorf("fake worker decode: %v", err)
				continue
			}
			handle(sock, zm.Frames[0], m)
		}
	}()
	t.Cleanup(func() { cancel(); sock.Close(); <-done })
}

func sendTo(sock zmq4.Socket, peer []byte, frame []byte) {
	_ = sock.SendMulti(zmq4.NewMsgFrom(peer, frame))
}

func encode(m wire.Message) []byte {
	b, err := wire.Encode(m)
	if err != nil {
		panic(err)
	}
	return b
}

func TestDial_VersionMismatchBothWays(t *testing.T) {
	for _, tc := range []struct {
		worker wire.Range
		want   string
	}{
		{wire.Range{Min: 3, Max: 3}, "worker speaks protocol 3, napd speaks 1: upgrade napd"},
		{wire.Range{Min: 0, Max: 0}, "worker speaks protocol 0, napd speaks 1: upgrade worker"},
	} {
		addr := newAddr(t)
		fakeWorker(t, addr, func(sock zmq4.Socket, peer []byte, m wire.Message) {
			if _, ok := m.(*wire.Hello); ok {
				sendTo(sock, peer, encode(&wire.Hello{MinVersion: tc.worker.Min, MaxVersion: tc.worker.Max, Software: "old-or-new"}))
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := client.Dial(ctx, addr, fast)
		cancel()
		var ve *wire.VersionError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("worker %v: got %v, want %q", tc.worker, err, tc.want)
		}
	}
}

func TestRoundTrip_ToleratesTrailingFieldsFromANewerWorker(t *testing.T) {
	addr := newAddr(t)
	fakeWorker(t, addr, func(sock zmq4.Socket, peer []byte, m wire.Message) {
		switch m := m.(type) {
		case *wire.Hello:
			sendTo(sock, peer, encode(&wire.Hello{MinVersion: 1, MaxVersion: 1}))
		case *wire.Submit:
			// Answer [id, content type, body, "extra"], by hand.
			frame := append([]byte{byte(wire.TypeAnswer), 0x94, 0xcf}, be64(m.ID)...)
			frame = append(frame, 0xaa)
			frame = append(frame, "text/plain"...)
			frame = append(frame, 0xc4, 0x02, 'o', 'k', 0xa5, 'e', 'x', 't', 'r', 'a')
			sendTo(sock, peer, frame)
		}
	})
	c := dial(t, addr, client.Options{HeartbeatInterval: time.Hour})
	resp, err := c.RoundTrip(post(context.Background(), "x"))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); resp.StatusCode != 200 || got != "ok" || resp.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("got %d %q", resp.StatusCode, got)
	}
}

func be64(v uint64) []byte {
	b := make([]byte, 8)
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
	return b
}

func TestRoundTrip_SilentWorkerIsDeclaredDead(t *testing.T) {
	addr := newAddr(t)
	fakeWorker(t, addr, func(sock zmq4.Socket, peer []byte, m wire.Message) {
		if _, ok := m.(*wire.Hello); ok {
			sendTo(sock, peer, encode(&wire.Hello{MinVersion: 1, MaxVersion: 1}))
		}
		// Then never a word: a hung worker.
	})
	states := make(chan client.State, 8)
	opts := fast
	opts.OnState = func(s client.State, _ error) { states <- s }
	c := dial(t, addr, opts)
	// Dead is the current session's: take it before the client reconnects
	// (the fake worker answers a new hello at once).
	dead := c.Dead()
	select {
	case <-dead:
		t.Fatal("a fresh session is already dead")
	default:
	}
	start := time.Now()
	_, err := c.RoundTrip(post(context.Background(), "x"))
	var de *client.DeadError
	if !errors.As(err, &de) || !strings.Contains(de.Reason, "silent for") {
		t.Fatalf("got %v, want a *DeadError for silence", err)
	}
	if took := time.Since(start); took > opts.DeadAfter+3*time.Second {
		t.Fatalf("declared dead after %v; bound is DeadAfter %v plus a heartbeat", took, opts.DeadAfter)
	}
	select {
	case <-dead:
	default:
		t.Fatal("the session's Dead() channel is not closed")
	}
	if s := <-states; s != client.Connected {
		t.Fatalf("first state %v", s)
	}
	if s := <-states; s != client.Dead {
		t.Fatalf("second state %v", s)
	}
}

// startHelper runs the test binary as a worker process at addr. The
// channel receives each request body that reached the worker.
func startHelper(t *testing.T, addr string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	received := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			received <- sc.Text()
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, received
}

func TestRoundTrip_WorkerKilledMidRequestFailsAtOnceAndReconnects(t *testing.T) {
	addr := newAddr(t)
	cmd, received := startHelper(t, addr)
	opts := client.Options{HeartbeatInterval: 100 * time.Millisecond, DeadAfter: time.Second}
	c := dial(t, addr, opts)

	errc := make(chan error, 1)
	go func() {
		_, err := c.RoundTrip(post(context.Background(), "slow"))
		errc <- err
	}()
	select { // the worker has the request
	case b := <-received:
		if b != "slow" {
			t.Fatalf("worker received %q", b)
		}
	case err := <-errc:
		t.Fatalf("request failed before the worker had it: %v", err)
	}
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		var de *client.DeadError
		if !errors.As(err, &de) || errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("got %v, want *DeadError of a request the worker had", err)
		}
	case <-time.After(opts.DeadAfter + 5*time.Second):
		t.Fatal("the in-flight request did not fail within the heartbeat bound")
	}
	t.Logf("in-flight request failed %v after kill -9", time.Since(killed))
	// A request made once the in-flight one has failed finds no session
	// (the session is gone before its death shows): it was never sent, and
	// reads as a refused connection, which napd may hold for the next worker.
	if _, err := c.RoundTrip(post(context.Background(), "x")); !errors.As(err, new(*client.DeadError)) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("request while down: got %v, want an unsent *DeadError", err)
	}

	// The worker comes back: the client reconnects by itself.
	_ = cmd.Wait()
	startHelper(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a starting process, as in dial
	defer cancel()
	if r, err := c.Readiness(ctx); err != nil || r.State != engine.Ready {
		t.Fatalf("after restart: %+v, %v", r, err)
	}
	resp, err := c.RoundTrip(post(ctx, "back"))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp.Body); got != "back" {
		t.Fatalf("got %q", got)
	}
}
