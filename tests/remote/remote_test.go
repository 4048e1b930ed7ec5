package remote

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/internal/demoengine"
	"github.com/napd/napd/internal/testca"
	"github.com/napd/napd/tests/harness"
)

// writeFile writes body to a new file name in dir with mode.
func writeFile(t *testing.T, dir, name, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
	return p
}

// remoteNapd is napd B, the remote: model qwen (a demo engine, awake from
// the start), API keys on, napd A's key among them.
func remoteNapd(t *testing.T, dir string) *harness.Napd {
	t.Helper()
	keys := writeFile(t, dir, "b-keys", "napd-a:sk-from-a\nother:sk-other\n", 0o600)
	return harness.Start(t, harness.Options{
		Models:  harness.DemoModel("qwen", "warm_on_start = true\nsleep = \"stop\"", "--ttft", "10ms"),
		Gateway: "api_keys_file = " + strconv.Quote(keys),
	})
}

// chat sends a chat request for model to n with header pairs and returns
// the status, headers and body.
func chat(t *testing.T, n *harness.Napd, model string, header ...string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat(model, false, 2), header...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// Another napd as the remote: napd A routes box2 to B's qwen with B's key
// (A's client's key never reaches B: B would refuse it, and counts the
// request under napd-a), maps the model name back, counts the request
// and its tokens under box2, and shows B's state of the model in napctl
// status as remote_state, following it. Once B stops, box2 turns
// unverified and its requests fail at once with 502 naming the remote.
func TestRemote_AnotherNapd(t *testing.T) {
	dir := t.TempDir()
	b := remoteNapd(t, dir)
	b.WaitModel("qwen", 20*time.Second, func(s control.ModelStatus) bool { return s.State == "awake" })
	aKeys := writeFile(t, dir, "a-keys", "alice:sk-alice\n", 0o600)
	bKey := writeFile(t, dir, "b.key", "sk-from-a\n", 0o600)
	a := harness.Start(t, harness.Options{
		Gateway: "api_keys_file = " + strconv.Quote(aKeys),
		Models: fmt.Sprintf(`[models.box2]
url = "http://%s/v1"
served_name = "qwen"
api_key_file = %q
aliases = ["qwen-elsewhere"]
health_interval = "1s"
health_failures = 2
`, b.Addr, bKey),
	})
	a.WaitModel("box2", 10*time.Second, func(s control.ModelStatus) bool { return s.State == "awake" && s.RemoteState == "awake" })

	resp, body := chat(t, a, "qwen-elsewhere", "Authorization", "Bearer sk-alice")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("through A: %d %s", resp.StatusCode, body)
	}
	var answer struct {
		Model string `json:"model"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil || answer.Model != "qwen-elsewhere" || answer.Usage.CompletionTokens == 0 {
		t.Errorf("the answer's model %q (want the alias sent), usage %+v: %s", answer.Model, answer.Usage, body)
	}
	if resp.Header.Get("X-Napd-Served-By") != "" {
		t.Error("a request for the remote model itself says it was served elsewhere")
	}
	if m := b.MetricsText(); !strings.Contains(m, `napd_requests_total{client="napd-a",code="200",model="qwen"} 1`) ||
		strings.Contains(m, `client="alice"`) {
		t.Errorf("B did not count one request of napd-a's key (nor alice's):\n%s", grep(m, "napd_requests_total"))
	}
	if m := a.MetricsText(); !strings.Contains(m, `napd_requests_total{client="alice",code="200",model="box2"} 1`) ||
		!strings.Contains(m, `napd_completion_tokens_total{client="alice",model="box2"}`) {
		t.Errorf("A's metrics:\n%s", grep(m, "box2"))
	}
	if strings.Contains(a.Log(), "sk-from-a") || strings.Contains(a.Log(), "sk-alice") {
		t.Error("A logged a key")
	}

	if out, err := b.Napctl("sleep", "qwen"); err != nil {
		t.Fatalf("napctl sleep on B: %v\n%s", err, out)
	}
	a.WaitModel("box2", 10*time.Second, func(s control.ModelStatus) bool { return s.RemoteState == "sleeping" })
	if out, err := a.Napctl("status"); err != nil || !strings.Contains(out, "box2: remote http://"+b.Addr+"/v1 · remote_state sleeping") {
		t.Errorf("napctl status: %v\n%s", err, out)
	}
	if out, err := a.Napctl("wake", "box2"); err == nil || !strings.Contains(out, "remote model") {
		t.Errorf("napctl wake of a remote model: %v\n%s", err, out)
	}

	b.Stop()
	s := a.WaitModel("box2", 10*time.Second, func(s control.ModelStatus) bool { return s.State == "unverified" })
	if !strings.Contains(s.Reason, "health check GET /v1/models") || s.RemoteState != "" {
		t.Errorf("unverified: %+v", s)
	}
	start := time.Now()
	resp, body = chat(t, a, "box2", "Authorization", "Bearer sk-alice")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "remote model box2 ("+b.Addr+") refused the connection") ||
		time.Since(start) > 5*time.Second {
		t.Errorf("box2 with B gone: %d after %s: %s", resp.StatusCode, time.Since(start), body)
	}
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// recorder is a demo engine behind TLS that notes each request's
// credential headers.
type recorder struct {
	mu   sync.Mutex
	seen []http.Header
}

func (r *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.Header.Clone())
		r.mu.Unlock()
		h.ServeHTTP(w, req)
	})
}

func (r *recorder) chats() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []http.Header
	for _, h := range r.seen {
		if h.Get("Content-Type") == "application/json" {
			out = append(out, h)
		}
	}
	return out
}

// A plain engine behind TLS, its certificate signed by a CA made in the
// test: reached with tls_ca_file it serves, with napd's credential in the
// header the remote wants and never the client's (keys off: the client's
// own Authorization is replaced); with another CA the request is refused
// before a byte is sent (502 naming the remote and the certificate) and
// the model is unverified. A request that outlives its deadline on a
// remote that hangs is a 504 at the deadline.
func TestRemote_TLSAndDeadline(t *testing.T) {
	dir := t.TempDir()
	ca, other := testca.New(t, "napd test CA"), testca.New(t, "some other CA")
	rec := &recorder{}
	eng := demoengine.New(demoengine.Options{Models: []string{"demo"}, TTFT: 5 * time.Millisecond})
	srv := httptest.NewUnstartedServer(rec.wrap(eng.Handler()))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server("127.0.0.1")}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // wrongca's refused handshakes are the test's
	srv.StartTLS()
	t.Cleanup(srv.Close)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{"data":[]}`))
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // then the server notices the client leave
		<-r.Context().Done()               // and never answers a completion
	}))
	t.Cleanup(hang.Close)

	caFile := writeFile(t, dir, "ca.pem", string(ca.PEM()), 0o644)
	otherFile := writeFile(t, dir, "other.pem", string(other.PEM()), 0o644)
	key := writeFile(t, dir, "tls.key", "sk-tls-remote\n", 0o640)
	n := harness.Start(t, harness.Options{Models: fmt.Sprintf(`[models.tls]
url = "%s/v1"
served_name = "demo"
tls_ca_file = %q
api_key_file = %q
api_key_header = "x-api-key"
health_interval = "1s"

[models.wrongca]
url = "%s/v1"
tls_ca_file = %q
health_interval = "1s"
health_failures = 1

[models.hang]
url = "%s"
health_interval = "0"
`, srv.URL, caFile, key, srv.URL, otherFile, hang.URL)})

	n.WaitModel("tls", 10*time.Second, func(s control.ModelStatus) bool { return s.State == "awake" })
	resp, body := chat(t, n, "tls", "Authorization", "Bearer sk-client", "X-Api-Key", "sk-client")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("tls: %d %s", resp.StatusCode, body)
	}
	chats := rec.chats()
	if len(chats) != 1 || chats[0].Get("X-Api-Key") != "sk-tls-remote" || chats[0].Get("Authorization") != "" ||
		chats[0].Get("X-Forwarded-For") != "" {
		t.Errorf("the engine saw %v, want napd's key in x-api-key alone", chats)
	}

	s := n.WaitModel("wrongca", 10*time.Second, func(s control.ModelStatus) bool { return s.Reason != "not checked yet" })
	if s.State != "unverified" || !strings.Contains(s.Reason, "certificate") {
		t.Errorf("wrongca: %+v", s)
	}
	resp, body = chat(t, n, "wrongca")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "remote model wrongca (") ||
		!strings.Contains(body, "its TLS certificate is not signed by a trusted authority") {
		t.Errorf("wrongca: %d %s", resp.StatusCode, body)
	}
	if got := len(rec.chats()); got != 1 {
		t.Errorf("the engine saw %d completions, want only tls's", got)
	}

	start := time.Now()
	resp, body = chat(t, n, "hang", "X-Request-Timeout", "1s")
	if took := time.Since(start); resp.StatusCode != http.StatusGatewayTimeout || took > 4*time.Second ||
		!strings.Contains(body, "remote model hang (") || !strings.Contains(body, "within the request deadline") {
		t.Errorf("hang: %d after %s: %s", resp.StatusCode, took, body)
	}

	// A reload with a key file every user may read is refused, and the
	// running configuration keeps serving with the key it read.
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := n.Napctl("reload"); err == nil || !strings.Contains(out, "lets every user read it") || strings.Contains(out, "sk-tls") {
		t.Errorf("napctl reload: %v\n%s", err, out)
	}
	if resp, body := chat(t, n, "tls"); resp.StatusCode != http.StatusOK {
		t.Errorf("tls after the refused reload: %d %s", resp.StatusCode, body)
	}
	if chats := rec.chats(); len(chats) != 2 || chats[1].Get("X-Api-Key") != "sk-tls-remote" {
		t.Errorf("after the refused reload the engine saw %v", chats)
	}
}

// napd --check reads a remote's files as a start would: a key others may
// read, or a CA file that holds no certificate, fails naming the key.
func TestRemote_CheckReadsTheFiles(t *testing.T) {
	dir := t.TempDir()
	open := writeFile(t, dir, "open.key", "sk-x\n", 0o644)
	notCA := writeFile(t, dir, "ca.pem", "nothing", 0o644)
	cfg := writeFile(t, dir, "napd.toml", fmt.Sprintf(`[models.r]
url = "https://h.example/v1"
api_key_file = %q
tls_ca_file = %q
`, open, notCA), 0o644)
	out, err := exec.Command(filepath.Join(harness.Bin(t), "napd"), "--check", "--config", cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "models.r.api_key_file") || !strings.Contains(string(out), "lets every user read it") ||
		!strings.Contains(string(out), "models.r.tls_ca_file") || strings.Contains(string(out), "sk-x") {
		t.Errorf("napd --check: %v\n%s", err, out)
	}
}
