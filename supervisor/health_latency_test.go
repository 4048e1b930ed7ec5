package supervisor

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// However long the engine takes to start, a wake returns within 50 ms of
// its health turning good: the gateway answers the waiting request then.
func TestWake_SeenWithin50msAfterSlowStart(t *testing.T) {
	for _, startup := range []time.Duration{700 * time.Millisecond, 3 * time.Second, time.Minute} {
		synctest.Test(t, func(t *testing.T) {
			h := &scriptedHealth{readyAt: time.Now().Add(startup)}
			s := New(newFakeBackend(ProcStopped), Options{HTTPClient: &http.Client{Transport: h}})
			defer s.Close()
			if err := s.Wake(context.Background(), Spec{Model: "m", Health: "/health", Sleep: "stop"}); err != nil {
				t.Fatal(err)
			}
			if late := time.Since(h.readyAt); late > 50*time.Millisecond {
				t.Errorf("start-up %v: ready engine seen %v after it was ready", startup, late)
			}
		})
	}
}
