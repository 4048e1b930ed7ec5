package events_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/napd/napd/agent/events"
)

func TestPublisher_SubscribersFilterByModel(t *testing.T) {
	addr := "ipc://" + filepath.Join(t.TempDir(), "events.sock")
	pub, err := events.NewPublisher(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(addr); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "qwen"); err != nil {
		t.Fatal(err)
	}
	want := events.Event{
		Time: time.Unix(1700000000, 5), Model: "qwen", Kind: events.KindWake,
		From: "waking", To: "awake", Reason: "request", WakeDuration: 1500 * time.Millisecond,
	}
	// A subscription takes a moment to reach the publisher (ZMQ's slow
	// joiner): publish until one arrives, within a bound.
	got := make(chan zmq4.Msg, 1)
	go func() {
		m, err := sub.Recv()
		if err == nil {
			got <- m
		}
	}()
	deadline := time.After(5 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var m zmq4.Msg
wait:
	for {
		select {
		case m = <-got:
			break wait
		case <-tick.C:
			if err := pub.Publish(events.Event{Model: "llama", Kind: events.KindSleep}); err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish(want); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("no event within 5s")
		}
	}
	if len(m.Frames) != 2 || string(m.Frames[0]) != "qwen" {
		t.Fatalf("frames %q", m.Frames)
	}
	e, err := events.Decode(m.Frames[1])
	if err != nil {
		t.Fatal(err)
	}
	if !e.Time.Equal(want.Time) || e.Model != want.Model || e.Kind != want.Kind || e.From != want.From ||
		e.To != want.To || e.Reason != want.Reason || e.WakeDuration != want.WakeDuration {
		t.Fatalf("got %+v, want %+v", e, want)
	}
	// The documented keys, as a non-Go subscriber sees them.
	var raw map[string]any
	if err := msgpack.Unmarshal(m.Frames[1], &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"v", "time_ns", "model", "kind", "from", "to", "reason", "wake_ms"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("key %q missing from %v", k, raw)
		}
	}
}

func TestPublisher_PublishDoesNotBlockWithoutSubscribers(t *testing.T) {
	pub, err := events.NewPublisher("ipc://" + filepath.Join(t.TempDir(), "e.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	done := make(chan struct{})
	go func() {
		for range 5000 {
			_ = pub.Publish(events.Event{Model: "m", Kind: events.KindState, To: "awake"})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked")
	}
}

func TestDecode_IgnoresUnknownKeys(t *testing.T) {
	payload, err := msgpack.Marshal(map[string]any{"v": 2, "model": "m", "kind": "state", "to": "failed", "future": []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(payload)
	if err != nil || e.Model != "m" || e.To != "failed" {
		t.Fatalf("got %+v, %v", e, err)
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := events.Encode(events.Event{Model: "m", Kind: events.KindWake, WakeDuration: time.Second})
	f.Add(b)
	f.Add([]byte{0x81, 0xa1, 'v', 0x01})
	f.Fuzz(func(t *testing.T, payload []byte) {
		e, err := events.Decode(payload)
		if err != nil {
			return
		}
		if _, err := events.Encode(e); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}
