package servers

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := config.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}

func answer(s string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, s) })
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Each listener serves its own handler; Shutdown lets a request in flight
// finish, ends the control requests' context, and stops accepting.
func TestStart_ServesAndShutsDown(t *testing.T) {
	cfg := config.Default()
	gw, model, mx := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg.Gateway.Listen = []string{gw}
	cfg.Agent.ControlSocket = filepath.Join(t.TempDir(), "run", "control.sock")
	cfg.Agent.MetricsListen = mx
	cfg.Models = []*config.Model{{Name: "m", Listen: model}}

	release, entered := make(chan struct{}), make(chan struct{})
	gateway := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
		io.WriteString(w, "gateway")
	})
	ctlCtx, endControl := context.WithCancel(context.Background())
	s, err := Start(cfg, Handlers{
		Gateway: gateway,
		Model:   func(name string) http.Handler { return answer("model " + name) },
		Control: answer("control"),
		Metrics: answer("metrics"),
	}, Contexts{Requests: context.Background(), Control: ctlCtx, End: endControl}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: time.Minute}
	unix := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", cfg.Agent.ControlSocket)
	}}}
	for url, want := range map[string]string{"http://" + gw + "/": "gateway", "http://" + model + "/": "model m", "http://" + mx + "/metrics": "metrics"} {
		if got := get(t, c, url); got != want {
			t.Errorf("%s: %q, want %q", url, got, want)
		}
	}
	if got := get(t, unix, "http://napd/v1/status"); got != "control" {
		t.Errorf("control socket: %q", got)
	}

	slow := make(chan string)
	go func() {
		resp, err := c.Get("http://" + gw + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-entered
	stopped := make(chan struct{})
	go func() { s.Shutdown(time.Minute); close(stopped) }()
	<-ctlCtx.Done() // the control requests' context ends first
	close(release)
	if got := <-slow; got != "gateway" {
		t.Errorf("the request in flight got %q", got)
	}
	<-stopped
	if conn, err := net.Dial("tcp", gw); err == nil {
		conn.Close()
		t.Error("the gateway still accepts after Shutdown")
	}
}
