package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/internal/fakeclock"
	"github.com/napd/napd/request"
)

// Observe reports the labels, the timings (queue and wake wait, time to
// the first byte, duration) and the engine's token counts of a plain and
// of a streamed answer.
func TestGateway_ObserveTimingsAndUsage(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	next := make(chan struct{})
	engine := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		clock.Advance(3 * time.Second) // the engine thinks before its first byte
		if r.URL.Path == "/v1/chat/completions" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":1000}\"}}],\"usage\":null}\n\n")
			http.NewResponseController(w).Flush()
			<-next // the client has the first chunk, and a second passed
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":22,\"total_tokens\":33}}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`)
	}
	e := newEnv(t, engine, Options{Now: clock.Now})
	e.models.admit = func(_ context.Context, a lease.Request) (*Ticket, error) {
		clock.Advance(2 * time.Second) // 1.5s for a wake, then 0.5s for a slot
		return e.models.ticket(1500 * time.Millisecond), nil
	}

	if resp, body := e.do("POST", "/v1/completions", `{"model":"a1","prompt":"x"}`, nil); resp.StatusCode != 200 {
		t.Fatalf("plain: %d %s", resp.StatusCode, body)
	}
	e.models.outcome()
	got := []Observation{e.next()}
	resp, err := e.client.Post(e.srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m1","stream":true,"messages":[]}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", resp, err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	close(next)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	e.models.outcome()
	got = append(got, e.next())
	if resp, _ := e.do("POST", "/v1/completions", `{"model":"nosuch"}`, nil); resp.StatusCode != 404 {
		t.Fatalf("unknown model: %d", resp.StatusCode)
	}
	got = append(got, e.next())

	want := []Observation{
		{Model: "m1", Kind: request.Completion, Status: 200, Duration: 5 * time.Second, Admitted: true,
			FirstByte: 5 * time.Second, QueueWait: 500 * time.Millisecond, WakeWait: 1500 * time.Millisecond,
			Usage: Usage{4, 2}, HasUsage: true},
		{Model: "m1", Kind: request.Chat, Stream: true, Status: 200, Duration: 6 * time.Second, Admitted: true,
			FirstByte: 5 * time.Second, QueueWait: 500 * time.Millisecond, WakeWait: 1500 * time.Millisecond,
			Usage: Usage{11, 22}, HasUsage: true},
		{Status: 404},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("observation %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}
