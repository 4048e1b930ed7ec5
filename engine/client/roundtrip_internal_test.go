package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

// A request that took the session just before it died must not be handed
// the session's death as if the worker had it: send refuses on a dead
// session without writing, so the request is unsent (ECONNREFUSED) and napd
// may hold or reroute it. The interleaving (current() returned cn, then cn
// died, then RoundTrip sends) is built directly; a real socket cannot be
// made to die at that instant.
func TestRoundTrip_SessionDiedBeforeSendIsUnsent(t *testing.T) {
	c := &Client{address: "ipc:///nowhere", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cn := &conn{
		client:  c,
		dead:    make(chan struct{}),
		calls:   make(map[uint64]*call),
		deadErr: &DeadError{Address: c.address, Reason: "connection lost: EOF"},
	}
	close(cn.dead) // as die does, after detach: cur is still cn only in this race
	c.cur = cn

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://engine/", strings.NewReader("x"))
	_, err := c.RoundTrip(req)
	var de *DeadError
	if !errors.As(err, &de) || !de.Unsent || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("got %v, want an unsent *DeadError", err)
	}
	if de.Reason != "connection lost: EOF" {
		t.Fatalf("reason %q, want the session's", de.Reason)
	}
	if len(cn.calls) != 0 {
		t.Fatalf("the unsent call is still registered: %v", cn.calls)
	}
}
