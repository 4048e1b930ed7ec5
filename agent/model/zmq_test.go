package model

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

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
