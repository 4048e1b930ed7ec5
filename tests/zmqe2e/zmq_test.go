//go:build linux

// Package zmqe2e runs napd against engine-contract workers over ZMQ: the
// Go example worker (engine/example) and a libzmq worker in Python, as real
// processes napd starts, wakes and loses.
package zmqe2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/napd/napd/agent/events"
	"github.com/napd/napd/tests/harness"
)

// workerModel is a [models.NAME] table for the example worker at address.
func workerModel(t *testing.T, name, address string, flags ...string) string {
	args := []string{fmt.Sprintf("%q", harness.ExampleWorker(t)), `"--bind"`, fmt.Sprintf("%q", address)}
	for _, f := range flags {
		args = append(args, fmt.Sprintf("%q", f))
	}
	return fmt.Sprintf("[models.%s]\ntransport = \"zmq\"\naddress = %q\nsleep = \"stop\"\ncommand = [%s]\n\n",
		name, address, strings.Join(args, ", "))
}

// chatWords is a chat body whose answer (the example worker echoes the last
// message word by word) takes n words to generate.
func chatWords(model string, stream bool, n int) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"messages":[{"role":"user","content":%q}]}`,
		model, stream, strings.TrimSpace(strings.Repeat("word ", n)))
}

// subscriber collects the lifecycle events napd publishes.
type subscriber struct {
	mu  sync.Mutex
	got []events.Event
}

func subscribe(t *testing.T, address string) *subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewSub(ctx)
	t.Cleanup(func() { cancel(); sock.Close() })
	if err := sock.Dial(address); err != nil {
		t.Fatal(err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	s := &subscriber{}
	go func() {
		for {
			msg, err := sock.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) != 2 {
				continue
			}
			if e, err := events.Decode(msg.Frames[1]); err == nil && e.Model == string(msg.Frames[0]) {
				s.mu.Lock()
				s.got = append(s.got, e)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// waitFor returns the first event match accepts, within a bound.
func (s *subscriber) waitFor(t *testing.T, what string, match func(events.Event) bool) events.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		for _, e := range s.got {
			if match(e) {
				s.mu.Unlock()
				return e
			}
		}
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Fatalf("no %s event; got %+v", what, s.got)
	return events.Event{}
}

// workerPID finds the running example worker bound at address.
func workerPID(t *testing.T, address string) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(cmdline, []byte{0})
		if len(args) > 2 && strings.HasSuffix(string(args[0]), "echo-worker") && bytes.Contains(cmdline, []byte(address)) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	t.Fatalf("no worker process bound at %s", address)
	return 0
}

// napd serves the example worker end to end: the first request starts the
// worker and waits for its readiness; answers, SSE streams and the worker's
// refusals come back with their HTTP meaning; lifecycle events reach a
// subscriber; a worker killed mid-answer cuts that answer at once, and the
// next request starts the worker again.
func TestZMQ_ExampleWorkerThroughNapd(t *testing.T) {
	worker := harness.IPCAddress(t, "echo")
	eventsAddr := harness.IPCAddress(t, "events")
	n := harness.Prepare(t, harness.Options{
		Models: workerModel(t, "echo", worker, "--load-time", "300ms", "--capacity", "1", "--word-delay", "10ms"),
	})
	n.SetAgent(fmt.Sprintf("events_address = %q", eventsAddr))
	n.Launch()
	sub := subscribe(t, eventsAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	// Answer, after a wake that waited for the worker's readiness.
	resp, body, err := n.Post(ctx, "/v1/chat/completions", chatWords("echo", false, 3))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"content":"word word word"`) {
		t.Fatalf("answer: status %d body %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Napd-Wake-Ms") == "" || resp.Header.Get("X-Queue-Depth") == "" {
		t.Errorf("answer headers = %v", resp.Header)
	}
	// The subscription may reach the publisher after the wake began (ZMQ's
	// slow joiner), so only its end is certain to be seen.
	sub.waitFor(t, "state →awake", func(e events.Event) bool {
		return e.Model == "echo" && e.Kind == events.KindState && e.From == "waking" && e.To == "awake"
	})
	wake := sub.waitFor(t, "wake", func(e events.Event) bool { return e.Model == "echo" && e.Kind == events.KindWake })
	if wake.WakeDuration < 300*time.Millisecond {
		t.Errorf("wake event %+v: shorter than the worker's 300ms load", wake)
	}

	// Streaming: the worker's chunks arrive as SSE.
	resp, body, err = n.Post(ctx, "/v1/chat/completions", chatWords("echo", true, 3))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") ||
		strings.Count(string(body), "data: ") != 4 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream: status %d headers %v body %q", resp.StatusCode, resp.Header, body)
	}

	// Refusal: the worker admits one request; a second one while the first
	// streams (its first chunk proves the worker has it) gets its NoRoom
	// as 503 with Retry-After, and the first one completes.
	long := openStream(ctx, t, n, chatWords("echo", true, 200))
	resp, body, err = n.Post(ctx, "/v1/chat/completions", chatWords("echo", false, 1))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "slots are busy") {
		t.Fatalf("refusal: status %d headers %v body %s", resp.StatusCode, resp.Header, body)
	}
	if rest, err := io.ReadAll(long.Body); err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the admitted stream: %v, ends %q", err, rest[max(len(rest)-40, 0):])
	}
	long.Body.Close()

	// The worker dies mid-answer: the answer is cut at once (its socket
	// closes), not after the request's deadline; the next request starts
	// it again.
	long = openStream(ctx, t, n, chatWords("echo", true, 300))
	killed := time.Now()
	if err := syscall.Kill(workerPID(t, worker), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(long.Body); err == nil {
		t.Fatalf("the stream in flight when the worker died ended as if complete: %q", rest[max(len(rest)-40, 0):])
	}
	long.Body.Close()
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("the cut took %s after the kill", took)
	}
	resp, body, err = n.Post(ctx, "/v1/chat/completions", chatWords("echo", false, 2))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Napd-Wake-Ms") == "" {
		t.Fatalf("after the kill: status %d headers %v body %s", resp.StatusCode, resp.Header, body)
	}
	// The lease of the failed request may still be live when the exit is
	// handled, so the model goes to sleeping or straight to waking.
	sub.waitFor(t, "state change for the exit", func(e events.Event) bool {
		return e.Model == "echo" && e.Kind == events.KindState && e.From == "awake" && strings.Contains(e.Reason, "engine exited")
	})
}

// openStream starts a streamed request and returns once its first chunk
// arrived: the worker has the request and is generating.
func openStream(ctx context.Context, t *testing.T, n *harness.Napd, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL("/v1/chat/completions"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream: status %d body %s", resp.StatusCode, b)
	}
	if _, err := resp.Body.Read(make([]byte, 1)); err != nil {
		t.Fatalf("stream: no first chunk: %v", err)
	}
	return resp
}

const python = "/usr/bin/python3"

// A worker written against libzmq (tests/zmq/worker.py, pyzmq) is served
// through napd like the Go one: napd starts it, verifies its readiness and
// forwards requests.
func TestZMQ_PythonWorkerThroughNapd(t *testing.T) {
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("%s cannot import zmq and msgpack (%v): apt-get install python3-zmq python3-msgpack", python, err)
	}
	worker := harness.IPCAddress(t, "py")
	script := filepath.Join(harness.RepoRoot(), "tests", "zmq", "worker.py")
	n := harness.Start(t, harness.Options{Models: fmt.Sprintf(`[models.py]
transport = "zmq"
address = %q
command = [%q, %q, %q]
environment = { PYTHONDONTWRITEBYTECODE = "1" }
`, worker, python, script, worker)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("py", false, 4))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte(`{"echo":"{`)) || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d headers %v body %s", resp.StatusCode, resp.Header, body)
	}
	if out, err := n.Napctl("status"); err != nil || !strings.Contains(out, "awake") {
		t.Errorf("napctl status: %v\n%s", err, out)
	}
}

// A worker that hangs but stays alive (SIGSTOP) is declared dead after the
// heartbeat bound: the request in flight gets 502, and the next request
// does not wait on the hung process for a whole wake_timeout: napd stops it
// and starts a new one.
func TestZMQ_HungWorkerIsReplaced(t *testing.T) {
	worker := harness.IPCAddress(t, "hung")
	n := harness.Start(t, harness.Options{
		Models: workerModel(t, "echo", worker) + "stop_timeout = \"1s\"\n",
		Policy: "wake_timeout = \"60s\"\n",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	if resp, body, err := n.Post(ctx, "/v1/chat/completions", chatWords("echo", false, 2)); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: %v %v %s", err, resp, body)
	}
	hung := workerPID(t, worker)
	if err := syscall.Kill(hung, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(hung, syscall.SIGKILL) })

	stopped := time.Now()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", chatWords("echo", false, 2))
	if err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("request to the hung worker: %v %v %s", err, resp, body)
	}
	if took := time.Since(stopped); took > 15*time.Second {
		t.Errorf("502 took %s: longer than the heartbeat bound", took)
	}

	woke := time.Now()
	resp, body, err = n.Post(ctx, "/v1/chat/completions", chatWords("echo", false, 2))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("request after the hang: %v %v %s", err, resp, body)
	}
	if took := time.Since(woke); took > 20*time.Second {
		t.Errorf("the replacement took %s: napd waited on the hung worker", took)
	}
	if err := syscall.Kill(hung, 0); err == nil {
		t.Errorf("the hung worker (pid %d) still exists", hung)
	}
	if pid := workerPID(t, worker); pid == hung {
		t.Errorf("still served by the hung pid %d", pid)
	}
}
