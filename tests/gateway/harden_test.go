//go:build linux

package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// A client reaches the engine's control routes neither through /upstream
// nor through the model's own socket: 403, and the engine stays awake and
// serving (a client used to be able to put it to sleep behind napd).
func TestHarden_EngineControlRoutesRefused(t *testing.T) {
	t.Parallel()
	listen := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	m, eng := demo(t, "m", fmt.Sprintf("sleep = \"vllm-l1\"\nlisten = %q\nenvironment = { VLLM_SERVER_DEV_MODE = \"1\" }", listen), "--sleep-mode", "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m})
	ctx := ctxFor(t, 60*time.Second)
	wake(t, n, "m")
	for _, url := range []string{
		n.URL("/upstream/m/sleep?level=1"),
		n.URL("/upstream/m//sleep"),
		n.URL("/upstream/m/%73leep"),
		n.URL("/upstream/m/collective_rpc"),
		n.URL("/upstream/m/release_memory_occupation"),
		"http://" + listen + "/sleep",
		"http://" + listen + "/wake_up",
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantError(t, resp, body, http.StatusForbidden, "engine_control_refused")
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/is_sleeping", eng.port))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		IsSleeping bool `json:"is_sleeping"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	if s.IsSleeping {
		t.Fatal("a client put the engine to sleep through napd")
	}
	r, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("m", false, 2))
	if err != nil {
		t.Fatal(err)
	}
	wantCompletion(t, r, body)
}

// A client that stops reading its stream is cut after write_timeout and
// its slot released: the model's only slot serves the next request.
func TestHarden_StalledStreamReaderReleasesItsSlot(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", "sleep = \"stop\"\nmax_concurrency = 1", "--ttft", "0", "--tokens-per-second", "0")
	n := harness.Start(t, harness.Options{Models: m, Gateway: `write_timeout = "1s"`})
	wake(t, n, "m")

	conn, err := net.Dial("tcp", n.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := harness.Chat("m", true, 32000)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: napd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	eventually(t, 20*time.Second, "the stalled stream running", func() bool { return eng.stats(t).Running == 1 })

	// Never read from conn: napd's writes block, then the bound cuts it.
	r, b, err := n.Post(ctxFor(t, 60*time.Second), "/v1/chat/completions", harness.Chat("m", false, 2))
	if err != nil {
		t.Fatalf("the next request did not get the slot of a stalled reader: %v", err)
	}
	wantCompletion(t, r, b)
	// The stalled stream's log line says it was cut.
	n.WaitLog("stream=true cancelled=true", 20*time.Second)
}

// An idle keep-alive connection is closed after keepalive_timeout.
func TestHarden_IdleKeepAliveClosed(t *testing.T) {
	t.Parallel()
	n := harness.Start(t, harness.Options{Gateway: `keepalive_timeout = "1s"`})
	conn, err := net.Dial("tcp", n.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	fmt.Fprint(conn, "GET /health HTTP/1.1\r\nHost: napd\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatal("napd closed the connection at once; want keep-alive")
	}
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: read %v, want EOF (closed by napd)", err)
	}
	t.Logf("idle connection closed after %s", time.Since(start).Round(time.Millisecond))
}

// Past max_connections a new connection gets 503 and is closed; the
// warning is logged once for the burst; napctl still works; a connection
// that closes makes room.
func TestHarden_MaxConnections(t *testing.T) {
	t.Parallel()
	n := harness.Start(t, harness.Options{Gateway: "max_connections = 3"})
	// Each client keeps its one connection open between requests.
	client := func() *http.Client {
		c := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}, Timeout: 30 * time.Second}
		t.Cleanup(c.CloseIdleConnections)
		return c
	}
	health := func(c *http.Client) (int, error) {
		resp, err := c.Get(n.URL("/health"))
		if err != nil {
			return 0, err
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// Fill the places, then keep knocking until three connections were
	// refused. A connection of the harness's own readiness check may still
	// hold a place at first and free it meanwhile: whoever gets that place
	// holds it too, and ends a burst of refusals.
	var held []*http.Client
	refused, bursts, inBurst := 0, 0, false
	for refused < 3 {
		c := client()
		s, err := health(c)
		switch {
		case err != nil:
			t.Fatal(err)
		case s == http.StatusServiceUnavailable:
			refused++
			if !inBurst {
				bursts++
			}
			inBurst = true
		case s == http.StatusOK:
			held, inBurst = append(held, c), false
			if len(held) > 3 {
				t.Fatalf("%d connections open with max_connections = 3", len(held))
			}
		default:
			t.Fatalf("status %d", s)
		}
	}
	if len(held) == 0 {
		t.Fatal("no connection served")
	}
	if out, err := n.Napctl("status"); err != nil {
		t.Errorf("napctl status past max_connections: %v\n%s", err, out)
	}
	held[0].CloseIdleConnections()
	eventually(t, 20*time.Second, "a freed place serves again", func() bool {
		s, err := health(client())
		return err == nil && s == 200
	})
	n.WaitLog("accepting connections again", 20*time.Second)
	if c := strings.Count(n.Log(), "connection limit reached"); c != bursts {
		t.Errorf("%d warnings for %d bursts of refusals", c, bursts)
	}
}

// The same Idempotency-Key with another body is 422, never the first
// answer; an error answer is not replayed.
func TestHarden_IdempotencyKeyBoundToItsRequest(t *testing.T) {
	t.Parallel()
	m, eng := demo(t, "m", `sleep = "stop"`, "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: m})
	ctx := ctxFor(t, 60*time.Second)
	wake(t, n, "m")
	key := []string{"Idempotency-Key", "order-7"}
	r, b, err := n.Post(ctx, "/v1/chat/completions", chatWith("m", "first", false, 2), key...)
	if err != nil {
		t.Fatal(err)
	}
	wantCompletion(t, r, b)
	r, b, err = n.Post(ctx, "/v1/chat/completions", chatWith("m", "second", false, 2), key...)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r, b, http.StatusUnprocessableEntity, "idempotency_key_reused")
	r, _, err = n.Post(ctx, "/v1/chat/completions", chatWith("m", "first", false, 2), key...)
	if err != nil || r.StatusCode != 200 || r.Header.Get("X-Napd-Replayed") != "true" {
		t.Errorf("the same request again: %v %v, want its replay", r, err)
	}
	if s := eng.stats(t); s.Completions != 1 {
		t.Errorf("engine completions = %d, want 1", s.Completions)
	}

	// The engine refuses max_tokens 0 (400): a retry runs again.
	bad := []string{"Idempotency-Key", "bad-1"}
	for i := range 2 {
		r, b, err := n.Post(ctx, "/v1/chat/completions", chatWith("m", "x", false, 0), bad...)
		if err != nil {
			t.Fatal(err)
		}
		if r.StatusCode != 400 || r.Header.Get("X-Napd-Replayed") != "" {
			t.Errorf("error answer, try %d: %d replayed=%q %s", i, r.StatusCode, r.Header.Get("X-Napd-Replayed"), b)
		}
	}
}

// 200 connections announce a 16 MiB body and send one byte: napd's peak
// resident memory stays small (memory follows the bytes that arrive).
func TestHarden_AnnouncedBodiesCostLittle(t *testing.T) {
	t.Parallel()
	n := harness.Start(t, harness.Options{Gateway: `request_timeout = "2s"`, Models: harness.DemoModel("m", `sleep = "stop"`)})
	before := residentKiB(t, n.Cmd.Process.Pid, "VmRSS")
	const conns = 200
	done := make(chan int, conns)
	for range conns {
		c, err := net.Dial("tcp", n.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: napd\r\nContent-Length: %d\r\n\r\n{", 16<<20)
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	// Each gets 504 once its deadline passes: every handler read its body.
	for range conns {
		if s := <-done; s != http.StatusGatewayTimeout {
			t.Fatalf("an announced-but-unsent body got %d, want 504", s)
		}
	}
	peak := residentKiB(t, n.Cmd.Process.Pid, "VmHWM")
	t.Logf("napd resident: %d MiB before, peak %d MiB with %d announced 16 MiB bodies", before>>10, peak>>10, conns)
	if peak-before > 200<<10 {
		t.Errorf("peak resident memory grew by %d MiB", (peak-before)>>10)
	}
}

// residentKiB reads a Vm* line of /proc/PID/status.
func residentKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
