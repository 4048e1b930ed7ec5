package daemon

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// napd speaks sd_notify on a real NOTIFY_SOCKET: READY=1 only once the
// gateway answers, a STATUS= line that follows the models' states and the
// requests in flight, WATCHDOG=1 pings at half WATCHDOG_USEC, RELOADING=1
// then READY=1 around a SIGHUP, and STOPPING=1 on SIGTERM.
func TestNotify_ReadyStatusWatchdogReloadStopping(t *testing.T) {
	sock := listenNotify(t)
	n := harness.Prepare(t, harness.Options{
		Models: harness.DemoModel("a", `sleep = "stop"`, "--startup-delay", "400ms", "--tokens-per-second", "20") +
			harness.DemoModel("b", `sleep = "stop"`),
	})
	sock.mu.Lock()
	sock.onReady = func() string {
		resp, err := http.Get(n.URL("/health"))
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		return resp.Status
	}
	sock.mu.Unlock()
	// WATCHDOG_PID stays unset: napd is not the process that exec'd it here.
	n.Launch("NOTIFY_SOCKET="+sock.path, "WATCHDOG_USEC=200000")

	ready := sock.waitLine(t, 0, "READY=1", 5*time.Second)
	if p := sock.readyProbes(); len(p) == 0 || p[0] != "200 OK" {
		t.Fatalf("gateway /health when READY=1 arrived: %q", p)
	}
	isStatus := func(want string) func(string) bool {
		return func(m string) bool { return strings.HasPrefix(m, "STATUS=") && strings.Contains(m, want) }
	}
	sock.waitFor(t, 0, "STATUS asleep", isStatus("2 models: 0 awake, 2 asleep; 0 requests in flight"), 10*time.Second)

	// A streamed request wakes a: the line shows it waking with its
	// request in flight, then awake.
	s := startStream(n, "a", 20)
	sock.waitFor(t, ready, "STATUS waking", isStatus("2 models: 0 awake, 1 asleep, 1 waking; 1 request in flight"), 10*time.Second)
	sock.waitFor(t, ready, "STATUS awake", isStatus("2 models: 1 awake, 1 asleep;"), 10*time.Second)
	<-s.done
	if s.err != nil || !s.full {
		t.Fatalf("stream: err %v, complete %v", s.err, s.full)
	}

	// Watchdog: 200ms interval, pings every 100ms.
	from := len(sock.all())
	time.Sleep(600 * time.Millisecond)
	pings := 0
	for _, m := range sock.all()[from:] {
		if hasLine(m, "WATCHDOG=1") {
			pings++
		}
	}
	if pings < 3 {
		t.Errorf("%d WATCHDOG=1 pings in 600ms with WATCHDOG_USEC=200000, want >= 3", pings)
	}

	from = len(sock.all())
	n.Signal(syscall.SIGHUP)
	rel := sock.waitLine(t, from, "RELOADING=1", 5*time.Second)
	if m := sock.all()[rel]; !strings.Contains(m, "MONOTONIC_USEC=") {
		t.Errorf("RELOADING message %q has no MONOTONIC_USEC", m)
	}
	sock.waitLine(t, rel+1, "READY=1", 5*time.Second)
	n.WaitLog("config reloaded", 5*time.Second)

	from = len(sock.all())
	n.Signal(syscall.SIGTERM)
	sock.waitLine(t, from, "STOPPING=1", 5*time.Second)
	if err := n.Wait(15 * time.Second); err != nil {
		t.Fatalf("napd exit: %v", err)
	}
}

// Outside systemd (no NOTIFY_SOCKET) napd runs and serves normally and
// logs no sd_notify complaint.
func TestNotify_NotUnderSystemd(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: harness.DemoModel("m", `sleep = "stop"`)})
	r := post(context.Background(), n, "m", harness.Chat("m", false, 2))
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("request: %v", r)
	}
	n.Signal(syscall.SIGTERM)
	if err := n.Wait(15 * time.Second); err != nil {
		t.Fatalf("napd exit: %v", err)
	}
	if strings.Contains(n.Log(), "sd_notify") {
		t.Errorf("log mentions sd_notify without a NOTIFY_SOCKET:\n%s", n.Log())
	}
}
