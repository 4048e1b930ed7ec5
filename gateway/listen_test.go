package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary act as a socket-activated napd: it calls
// Listeners with the models in NAPD_TEST_MODELS ("name=addr,…"), prints
// the result as one JSON line and serves every listener until stdin closes.
const helperEnv = "NAPD_GATEWAY_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "activation" {
		os.Exit(activationHelper())
	}
	os.Exit(m.Run())
}

type helperReport struct {
	Err       string
	Activated bool
	Gateway   int
	Models    []string
	EnvLeft   string
}

func activationHelper() int {
	models := map[string]string{}
	for _, kv := range strings.Split(os.Getenv("NAPD_TEST_MODELS"), ",") {
		if name, addr, ok := strings.Cut(kv, "="); ok {
			models[name] = addr
		}
	}
	gw, ms, activated, err := Listeners([]string{"127.0.0.1:0"}, models)
	rep := helperReport{Activated: activated, Gateway: len(gw), EnvLeft: os.Getenv("LISTEN_FDS") + os.Getenv("LISTEN_PID")}
	if err != nil {
		rep.Err = err.Error()
	}
	for name, l := range ms {
		rep.Models = append(rep.Models, name)
		go func() {
			_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "model:"+name) }))
		}()
	}
	for _, l := range gw {
		go func() {
			_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "gateway") }))
		}()
	}
	_ = json.NewEncoder(os.Stdout).Encode(rep)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// activated runs the helper with the given listeners passed as fds 3… and
// LISTEN_PID set to the helper's own pid, as systemd does.
func activated(t *testing.T, names []string, models string) (helperReport, []string) {
	t.Helper()
	var files []*os.File
	var addrs []string
	for range names {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f, err := l.(*net.TCPListener).File()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		_ = l.Close() // the dup in f keeps the socket open
		files = append(files, f)
	}
	// exec keeps the pid, so $$ is the pid the helper will see.
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" -test.run=^$`, os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=activation", "NAPD_TEST_MODELS="+models,
		fmt.Sprintf("LISTEN_FDS=%d", len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	cmd.ExtraFiles = files
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		_ = f.Close()
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	var rep helperReport
	if err := json.Unmarshal(line, &rep); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}
	return rep, addrs
}

func get(t *testing.T, addr string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestListeners_ServesInheritedSockets(t *testing.T) {
	rep, addrs := activated(t, []string{"gateway", "model-m1", "gateway"}, "m1=127.0.0.1:1")
	if rep.Err != "" || !rep.Activated || rep.Gateway != 2 || len(rep.Models) != 1 || rep.Models[0] != "m1" {
		t.Fatalf("helper report %+v", rep)
	}
	if rep.EnvLeft != "" {
		t.Errorf("LISTEN_* left in the environment: %q", rep.EnvLeft)
	}
	for i, want := range []string{"gateway", "model:m1", "gateway"} {
		if got := get(t, addrs[i]); got != want {
			t.Errorf("socket %d answered %q, want %q", i, got, want)
		}
	}
}

func TestListeners_ActivationErrors(t *testing.T) {
	cases := []struct {
		names  []string
		models string
		want   string
	}{
		{[]string{"model-m1"}, "m1=127.0.0.1:1", `no listening socket named "gateway"`},
		{[]string{"gateway", "model-ghost"}, "", `socket "model-ghost" is for model "ghost", which has no`},
		{[]string{"gateway"}, "m1=127.0.0.1:1", `model "m1" has listen`},
		{[]string{"gateway", "metrics"}, "", `unexpected socket "metrics"`},
	}
	for _, c := range cases {
		rep, _ := activated(t, c.names, c.models)
		if !rep.Activated || !strings.Contains(rep.Err, c.want) {
			t.Errorf("%v: report %+v, want error %q", c.names, rep, c.want)
		}
	}
}

func TestListeners_BindsWithoutActivation(t *testing.T) {
	t.Setenv("LISTEN_FDS", "1")
	t.Setenv("LISTEN_PID", "1") // another process's sockets: ignored
	gw, ms, act, err := Listeners([]string{"127.0.0.1:0", "127.0.0.1:0"}, map[string]string{"m1": "127.0.0.1:0"})
	if err != nil || act {
		t.Fatalf("err %v, activated %v", err, act)
	}
	defer closeAll(gw)
	defer ms["m1"].Close()
	if len(gw) != 2 || ms["m1"] == nil {
		t.Fatalf("gateway %v models %v", gw, ms)
	}
	if os.Getenv("LISTEN_FDS") != "" {
		t.Error("LISTEN_FDS not unset")
	}
	busy := gw[0].Addr().String()
	if _, _, _, err := Listeners([]string{"127.0.0.1:0"}, map[string]string{"m1": busy}); err == nil || !strings.Contains(err.Error(), "model m1 listen") {
		t.Errorf("busy address: %v", err)
	}
	if _, _, _, err := Listeners(nil, nil); err == nil {
		t.Error("no gateway address accepted")
	}
}
