package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/events"
)

// Only model lifecycle events are published, in the events schema; planner
// decisions and reloads stay on the control socket.
func TestLifecycleEvent(t *testing.T) {
	at := time.Unix(1700000000, 0)
	got, ok := lifecycleEvent(control.Event{Time: at, Model: "m", Kind: "wake", Reason: "woke in 1.5s", WakeMs: 1500})
	want := events.Event{Time: at, Model: "m", Kind: events.KindWake, Reason: "woke in 1.5s", WakeDuration: 1500 * time.Millisecond}
	if !ok || got != want {
		t.Errorf("wake = %+v %v, want %+v", got, ok, want)
	}
	got, ok = lifecycleEvent(control.Event{Model: "m", Kind: "state", From: "awake", To: "draining", Reason: "idle"})
	if !ok || got.Kind != events.KindState || got.From != "awake" || got.To != "draining" || got.Reason != "idle" {
		t.Errorf("state = %+v %v", got, ok)
	}
	for _, e := range []control.Event{{Model: "m", Kind: "decision"}, {Kind: "reload"}, {Kind: "state"}} {
		if _, ok := lifecycleEvent(e); ok {
			t.Errorf("%+v is published", e)
		}
	}
}

// A just started worker's ipc socket file is waited for; other transports
// are dialed at once; a socket that never appears ends with the deadline.
func TestWaitForSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.sock")
	bound := make(chan net.Listener, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		l, _ := net.Listen("unix", path)
		bound <- l
	}()
	defer func() {
		if l := <-bound; l != nil {
			l.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := waitForSocket(ctx, "ipc://"+path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if err := waitForSocket(ctx, "tcp://127.0.0.1:1"); err != nil {
		t.Errorf("tcp address: %v", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancelShort()
	if err := waitForSocket(short, "ipc://"+filepath.Join(t.TempDir(), "never.sock")); err == nil {
		t.Error("a socket that never appears was found")
	}
}
