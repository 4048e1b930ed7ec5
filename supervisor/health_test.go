package supervisor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// scriptedHealth answers /health 503 until readyAt (200 after), or never
// when hang is set, and records when each probe arrived. It runs inside a
// synctest bubble, so time is the bubble's.
type scriptedHealth struct {
	readyAt time.Time
	hang    bool

	mu     sync.Mutex
	probes []time.Time
}

func (h *scriptedHealth) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	h.probes = append(h.probes, time.Now())
	h.mu.Unlock()
	if h.hang {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	code := http.StatusServiceUnavailable
	if !time.Now().Before(h.readyAt) {
		code = http.StatusOK
	}
	return &http.Response{StatusCode: code, Status: strconv.Itoa(code) + " " + http.StatusText(code), Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
}

func TestWake_HealthSeenSoonAfterReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h := &scriptedHealth{readyAt: start.Add(time.Second)}
		s := New(newFakeBackend(ProcStopped), Options{HTTPClient: &http.Client{Transport: h}})
		defer s.Close()
		if err := s.Wake(context.Background(), Spec{Model: "m", Health: "/health", Sleep: "stop"}); err != nil {
			t.Fatal(err)
		}
		if late := time.Since(h.readyAt); late < 0 || late > maxProbePause {
			t.Errorf("ready engine seen %v after it was ready", late)
		}
		// Fast at first: probes at 0, 10ms, 25ms, 47.5ms.
		for i, want := range []time.Duration{0, 10 * time.Millisecond, 25 * time.Millisecond, 47500 * time.Microsecond} {
			if got := h.probes[i].Sub(start); got != want {
				t.Errorf("probe %d at %v, want %v", i, got, want)
			}
		}
	})
}

func TestWake_ReadyEngineSeenAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h := &scriptedHealth{readyAt: start.Add(30 * time.Millisecond)}
		s := New(newFakeBackend(ProcStopped), Options{HTTPClient: &http.Client{Transport: h}})
		defer s.Close()
		if err := s.Wake(context.Background(), Spec{Model: "m", Sleep: "stop"}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 50*time.Millisecond {
			t.Errorf("engine ready at 30ms seen at %v", took)
		}
	})
}

func TestWake_HangingHealthFailsAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &scriptedHealth{hang: true}
		s := New(newFakeBackend(ProcStopped), Options{HTTPClient: &http.Client{Transport: h}})
		defer s.Close()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		err := s.Wake(ctx, Spec{Model: "m", Health: "/health", Sleep: "stop"})
		if took := time.Since(start); took != 10*time.Minute {
			t.Errorf("failed after %v, want at the 10m deadline", took)
		}
		var hte *HealthTimeoutError
		if !errors.As(err, &hte) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wake = %v, want a HealthTimeoutError", err)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "wake m: health check did not pass within 10m: last error: GET /health: ") {
			t.Errorf("error %q", msg)
		}
		// Each hung probe was cut at probeTimeout, not left to hang.
		if n := len(h.probes); n < 100 {
			t.Errorf("%d probes in 10m", n)
		}
	})
}

func TestWake_CancelledIsNotATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &scriptedHealth{readyAt: time.Now().Add(time.Hour)}
		s := New(newFakeBackend(ProcStopped), Options{HTTPClient: &http.Client{Transport: h}})
		defer s.Close()
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		err := s.Wake(ctx, Spec{Model: "m", Sleep: "stop"})
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "503") {
			t.Errorf("Wake = %v", err)
		}
	})
}

func TestNextProbePause(t *testing.T) {
	d := firstProbePause
	for range 20 {
		d = nextProbePause(d)
	}
	if d != maxProbePause {
		t.Errorf("pause grows to %v, want the cap %v", d, maxProbePause)
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10 * time.Minute:                 "10m",
		2 * time.Hour:                    "2h",
		90 * time.Second:                 "1m30s",
		1500 * time.Millisecond:          "1.5s",
		time.Hour + 234*time.Microsecond: "1h",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
