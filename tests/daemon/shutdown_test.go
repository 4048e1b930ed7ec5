package daemon

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// SIGTERM under load: every request accepted before the signal finishes in
// full (streams to their [DONE]) — none is reset mid-response; napd then
// exits 0 promptly, even with a `napctl events -f` attached, and leaves no
// exec engine running.
func TestShutdown_SIGTERMUnderLoad(t *testing.T) {
	n := harness.Start(t, harness.Options{
		Models: demo("a", "", "--tokens-per-second", "20") + demo("b", "", "--tokens-per-second", "20"),
	})
	ctx := context.Background()
	for _, m := range []string{"a", "b"} {
		if r := post(ctx, n, m, harness.Chat(m, false, 2)); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("warm-up %v", r)
		}
	}
	engines := enginePIDs(n)

	// An events follower holds a control connection open: shutdown must
	// not wait the whole grace period for it.
	events := exec.Command(filepath.Join(harness.Bin(t), "napctl"), "--socket", n.Socket, "events", "-f")
	if err := events.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = events.Process.Kill(); _ = events.Wait() })

	// Streams of 60 tokens at 20/s (about 3s, so that none ends before the
	// last one is under way on a busy machine) and plain requests of the
	// same length, all under way when the signal comes.
	const tokens = 60
	var streams []*stream
	for _, m := range []string{"a", "b", "a", "b"} {
		streams = append(streams, startStream(n, m, tokens))
	}
	plain := make(chan result, 2)
	for _, m := range []string{"a", "b"} {
		go func() { plain <- post(ctx, n, m, harness.Chat(m, false, tokens)) }()
	}
	for _, s := range streams {
		select {
		case <-s.began:
		case <-time.After(10 * time.Second):
			t.Fatal("stream did not begin")
		}
	}
	// The plain requests are under way too: napd holds all six leases.
	n.WaitLeases("a", 3, 10*time.Second)
	n.WaitLeases("b", 3, 10*time.Second)
	stopAt := time.Now()
	n.Signal(syscall.SIGTERM)

	for i, s := range streams {
		<-s.done
		if s.err != nil || s.code != http.StatusOK || !s.full {
			t.Errorf("stream %d: status %d, complete %v, err %v", i, s.code, s.full, s.err)
		}
	}
	for range 2 {
		if r := <-plain; r.err != nil || r.status != http.StatusOK || strings.Count(r.body, "tok") < tokens {
			t.Errorf("in-flight request: %v", r)
		}
	}
	// After the signal the gateway takes no new connection: a clean
	// refusal, never a reset of an accepted one. (A new connection: the
	// shared client's idle ones were closed by the shutdown.)
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := fresh.Post(n.URL("/v1/chat/completions"), "application/json", strings.NewReader(harness.Chat("a", false, 2)))
	if err == nil {
		resp.Body.Close()
		t.Errorf("request after SIGTERM answered %s, want connection refused", resp.Status)
	} else if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("request after SIGTERM: %v, want connection refused", err)
	}

	if err := n.Wait(10 * time.Second); err != nil {
		t.Fatalf("napd exit: %v", err)
	}
	if took := time.Since(stopAt); took > 8*time.Second {
		t.Errorf("shutdown took %s with an events follower attached", took)
	}
	for model, pids := range engines {
		for _, pid := range pids {
			if alive(pid) {
				t.Errorf("engine of %s (pid %d) still runs after napd exited", model, pid)
			}
		}
	}
	if len(engines) != 2 {
		t.Errorf("engine pids %v, want a and b", engines)
	}
}
