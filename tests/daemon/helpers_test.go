//go:build linux

// Package daemon tests napd as an operator meets it: sd_notify messages on a
// real NOTIFY_SOCKET, SIGHUP reloads and SIGTERM under load, every napctl
// command, the Prometheus output, the control socket's mode and what reaches
// the log. Each test runs the real binaries through tests/harness.
package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/napd/napd/tests/harness"
)

// notifySocket is a unixgram socket standing in for systemd's NOTIFY_SOCKET.
// Every datagram is recorded in arrival order; onReady runs when READY=1
// arrives, before the next datagram is read.
type notifySocket struct {
	path string
	conn *net.UnixConn

	mu      sync.Mutex
	msgs    []string
	onReady func() string // result recorded in readyProbes
	probes  []string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	dir, err := os.MkdirTemp("", "napd-notify-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &notifySocket{path: path, conn: conn}
	go s.read()
	return s
}

func (s *notifySocket) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			return
		}
		msg := string(buf[:n])
		s.mu.Lock()
		probe := s.onReady
		s.mu.Unlock()
		// The probe's result is recorded with the message, not after it:
		// whoever sees READY=1 in msgs sees what the probe found.
		ready := probe != nil && hasLine(msg, "READY=1")
		var r string
		if ready {
			r = probe()
		}
		s.mu.Lock()
		if ready {
			s.probes = append(s.probes, r)
		}
		s.msgs = append(s.msgs, msg)
		s.mu.Unlock()
	}
}

func hasLine(msg, line string) bool {
	for _, l := range strings.Split(msg, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// all returns the datagrams received so far.
func (s *notifySocket) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.msgs...)
}

func (s *notifySocket) readyProbes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.probes...)
}

// waitFor waits until a datagram at index from or later matches and returns
// its index.
func (s *notifySocket) waitFor(t *testing.T, from int, what string, match func(string) bool, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msgs := s.all()
		for i := from; i < len(msgs); i++ {
			if match(msgs[i]) {
				return i
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no notify message %s within %s; got %q", what, within, msgs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *notifySocket) waitLine(t *testing.T, from int, line string, within time.Duration) int {
	t.Helper()
	return s.waitFor(t, from, line, func(m string) bool { return hasLine(m, line) }, within)
}

// scrape fetches napd's metrics and parses them with expfmt.
func scrape(t *testing.T, n *harness.Napd) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + n.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return fams
}

// sample finds the metric of family name whose labels include labels.
func sample(fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		have := make(map[string]string)
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is a counter's or gauge's value; -1 when the sample is missing.
func value(m *dto.Metric) float64 {
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return -1
}

var enginePID = regexp.MustCompile(`msg="engine started" (?:\S+ )*?model=(\S+) pid=(\d+)`)

// enginePIDs are the pids napd logged for each model's engine starts.
func enginePIDs(n *harness.Napd) map[string][]int {
	out := make(map[string][]int)
	for _, m := range enginePID.FindAllStringSubmatch(n.Log(), -1) {
		pid, _ := strconv.Atoi(m[2])
		out[m[1]] = append(out[m[1]], pid)
	}
	return out
}

// alive reports whether pid runs (a zombie counts as gone).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state is the field after the ")" that ends the command name.
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// waitGone waits until pid no longer runs.
func waitGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("engine pid %d still runs after %s", pid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// result is one request's outcome under load.
type result struct {
	model  string
	status int
	err    error
	body   string
}

func (r result) String() string {
	if r.err != nil {
		return fmt.Sprintf("%s: error %v", r.model, r.err)
	}
	return fmt.Sprintf("%s: %d %s", r.model, r.status, strings.TrimSpace(r.body))
}

// loader sends requests for each model in a loop until stopped, one at a
// time per model, and keeps every outcome.
type loader struct {
	n      *harness.Napd
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	res    []result
}

func startLoad(n *harness.Napd, models ...string) *loader {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loader{n: n, cancel: cancel}
	for _, m := range models {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				r := post(context.Background(), n, m, harness.Chat(m, false, 2))
				l.mu.Lock()
				l.res = append(l.res, r)
				l.mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return l
}

// stop ends the load and returns every outcome.
func (l *loader) stop() []result {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]result(nil), l.res...)
}

// count is how many requests for model ended so far.
func (l *loader) count(model string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := 0
	for _, r := range l.res {
		if r.model == model {
			c++
		}
	}
	return c
}

func post(ctx context.Context, n *harness.Napd, model, body string, header ...string) result {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, b, err := n.Post(ctx, "/v1/chat/completions", body, header...)
	if err != nil {
		return result{model: model, err: err}
	}
	return result{model: model, status: resp.StatusCode, body: string(b)}
}

// stream is a streamed completion read to its end: it records whether the
// response began and whether it ended with [DONE].
type stream struct {
	began chan struct{}
	done  chan struct{}
	err   error
	code  int
	full  bool
}

func startStream(n *harness.Napd, model string, maxTokens int) *stream {
	s := &stream{began: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		began := false
		defer func() {
			if !began {
				close(s.began)
			}
		}()
		req, _ := http.NewRequest(http.MethodPost, n.URL("/v1/chat/completions"), strings.NewReader(harness.Chat(model, true, maxTokens)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			s.err = err
			return
		}
		defer resp.Body.Close()
		s.code = resp.StatusCode
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: ") && !began {
				began = true
				close(s.began)
			}
			if strings.TrimSpace(line) == "data: [DONE]" {
				s.full = true
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.err = err
				}
				return
			}
		}
	}()
	return s
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
