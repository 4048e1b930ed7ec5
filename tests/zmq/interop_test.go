// Package zmq holds the interop tests between napd's Go transport
// (go-zeromq/zmq4) and real libzmq, through Debian's python3-zmq and
// python3-msgpack run with /usr/bin/python3.
package zmq

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/engine"
	"github.com/napd/napd/engine/client"
)

const python = "/usr/bin/python3"

// needPython skips when the interpreter lacks the modules; install them with
// apt-get install python3-zmq python3-msgpack (scripts/test-deps.sh).
func needPython(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("%s cannot import zmq and msgpack (%v): apt-get install python3-zmq python3-msgpack", python, err)
	}
}

// pythonCmd runs a script from this folder without leaving __pycache__ in it.
func pythonCmd(ctx context.Context, script string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, python, append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	return cmd
}

func TestInterop_PythonWorkerServedByGoClient(t *testing.T) {
	needPython(t)
	addr := "ipc://" + filepath.Join(t.TempDir(), "py.sock")
	cmd := pythonCmd(context.Background(), "worker.py", addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{HeartbeatInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r, err := c.Readiness(ctx); err != nil || r.State != engine.Ready {
		t.Fatalf("readiness %+v, %v", r, err)
	}
	do := func(body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://engine/v1/chat/completions", strings.NewReader(body))
		resp, err := c.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s: read: %v", body, err)
		}
		return resp, string(b)
	}

	resp, body := do("hi")
	if resp.StatusCode != 200 || body != `{"echo":"hi"}` || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("answer: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if d := resp.Header.Get("X-Queue-Depth"); d != "7" {
		t.Errorf("X-Queue-Depth %q, want 7 (from the worker's report)", d)
	}
	resp, body = do("refuse")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, `python says \"no room\"`) {
		t.Errorf("refusal: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	resp, body = do("stream")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || body != "data: a\n\ndata: b\n\ndata: [DONE]\n\n" {
		t.Errorf("stream: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// goWorker answers the Python client's requests.
type goWorker struct{}

func (goWorker) Readiness() engine.Readiness { return engine.Readiness{State: engine.Ready} }

func (goWorker) Submit(body []byte, _ time.Time) engine.Reply {
	switch string(body) {
	case "refuse":
		return engine.Refused(engine.InvalidRequest, "go says no")
	case "stream":
		out := make(chan engine.Part, 3)
		out <- engine.Part{Chunk: &engine.Chunk{Data: []byte("data: a\n\n"), ContentType: "text/event-stream"}}
		out <- engine.Part{Chunk: &engine.Chunk{Data: []byte("data: b\n\n")}}
		out <- engine.Part{Answer: &engine.Answer{Body: []byte("data: [DONE]\n\n")}}
		close(out)
		return out
	}
	return engine.Answered(body, "text/plain")
}

func TestInterop_GoWorkerDrivenByPythonClient(t *testing.T) {
	needPython(t)
	addr := "ipc://" + filepath.Join(t.TempDir(), "go.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- engine.Serve(ctx, goWorker{}, addr) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	runCtx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	out, err := pythonCmd(runCtx, "client.py", addr).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("python client: %v\n%s", err, out)
	}
}
