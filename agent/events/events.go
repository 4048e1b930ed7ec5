// Package events publishes napd's model lifecycle events on a ZMQ PUB
// socket (agent.events_address), so local tools can follow model states
// without polling. The schema is in docs/engine-contract.md.
//
// It owns the PUB socket and the event schema. Publishing must not slow the
// agent: an event a subscriber is too slow for is dropped, never queued
// without bound.
package events

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/engine/ipcsock"
)

// Kind classifies an event.
type Kind string

// Event kinds.
const (
	KindState Kind = "state" // a lifecycle state change
	KindWake  Kind = "wake"  // a wake finished; WakeDuration says how long it took
	KindSleep Kind = "sleep" // a model was put to sleep
)

// SchemaVersion is the "v" key of every event. Keys may be added within a
// version; subscribers ignore keys they do not know.
const SchemaVersion = 1

// Event is one lifecycle event. It never carries a request, prompt or
// credential.
type Event struct {
	Time         time.Time
	Model        string
	Kind         Kind
	From, To     string // lifecycle states, e.g. "sleeping", "waking"
	Reason       string
	WakeDuration time.Duration // for KindWake
}

// record is Event on the wire: a msgpack map with short, stable keys.
type record struct {
	V      int    `msgpack:"v"`
	TimeNS int64  `msgpack:"time_ns"`
	Model  string `msgpack:"model"`
	Kind   string `msgpack:"kind"`
	From   string `msgpack:"from,omitempty"`
	To     string `msgpack:"to,omitempty"`
	Reason string `msgpack:"reason,omitempty"`
	WakeMS int64  `msgpack:"wake_ms,omitempty"`
}

// queueLimit bounds events waiting for slow subscribers; past it new events
// are dropped rather than blocking napd or growing without end.
const queueLimit = 1024

// Publisher is a bound PUB socket. It is safe for concurrent use.
type Publisher struct {
	sock zmq4.Socket
}

// NewPublisher binds a PUB socket at address (e.g. ipc:///run/napd/events.sock).
func NewPublisher(address string) (*Publisher, error) {
	if err := ipcsock.RemoveStale(address); err != nil {
		return nil, fmt.Errorf("events publisher %s: %w", address, err)
	}
	sock := zmq4.NewPub(context.Background(), zmq4.WithLogger(log.New(io.Discard, "", 0)))
	if err := sock.SetOption(zmq4.OptionHWM, queueLimit); err != nil {
		sock.Close()
		return nil, fmt.Errorf("events publisher %s: %w", address, err)
	}
	if err := sock.Listen(address); err != nil {
		sock.Close()
		return nil, fmt.Errorf("events publisher %s: %w", address, err)
	}
	return &Publisher{sock: sock}, nil
}

// Publish queues e for every subscriber of its model and returns at once;
// the topic frame is the model name. It fails only if e cannot be encoded
// or the publisher is closed.
func (p *Publisher) Publish(e Event) error {
	payload, err := Encode(e)
	if err != nil {
		return err
	}
	if err := p.sock.SendMulti(zmq4.NewMsgFrom([]byte(e.Model), payload)); err != nil {
		return fmt.Errorf("publish %s event for %s: %w", e.Kind, e.Model, err)
	}
	return nil
}

// Forward publishes the lifecycle events (state, wake, sleep) that arrive
// on in until ctx ends, then closes the publisher; planner decisions and
// reloads are not model lifecycle events and stay off the socket. A
// failure is logged and the next event sent.
func (p *Publisher) Forward(ctx context.Context, in <-chan control.Event, log *slog.Logger) {
	defer p.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-in:
			ev, ok := FromControl(e)
			if !ok {
				continue
			}
			if err := p.Publish(ev); err != nil {
				log.Warn("publishing a lifecycle event", "err", err)
			}
		}
	}
}

// published are the kinds of napd's events this schema carries, by their
// kind here.
var published = map[control.EventKind]Kind{
	control.EventState: KindState,
	control.EventWake:  KindWake,
	control.EventSleep: KindSleep,
}

// FromControl maps one of napd's events onto this schema; ok is false for
// events that are not a model's lifecycle (planner decisions, reloads).
func FromControl(e control.Event) (ev Event, ok bool) {
	kind, ok := published[e.Kind]
	if e.Model == "" || !ok {
		return Event{}, false
	}
	return Event{
		Time: e.Time, Model: e.Model, Kind: kind, From: e.From, To: e.To, Reason: e.Reason,
		WakeDuration: time.Duration(e.WakeMs) * time.Millisecond,
	}, true
}

// Close unbinds the socket.
func (p *Publisher) Close() error { return p.sock.Close() }

// Encode renders e as the msgpack map subscribers receive.
func Encode(e Event) ([]byte, error) {
	b, err := msgpack.Marshal(record{
		V:      SchemaVersion,
		TimeNS: e.Time.UnixNano(),
		Model:  e.Model,
		Kind:   string(e.Kind),
		From:   e.From,
		To:     e.To,
		Reason: e.Reason,
		WakeMS: e.WakeDuration.Milliseconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("encode %s event for %s: %w", e.Kind, e.Model, err)
	}
	return b, nil
}

// Decode parses an event payload; unknown keys are ignored.
func Decode(payload []byte) (Event, error) {
	var r record
	if err := msgpack.Unmarshal(payload, &r); err != nil {
		return Event{}, fmt.Errorf("decode event: %w", err)
	}
	return Event{
		Time:         time.Unix(0, r.TimeNS),
		Model:        r.Model,
		Kind:         Kind(r.Kind),
		From:         r.From,
		To:           r.To,
		Reason:       r.Reason,
		WakeDuration: time.Duration(r.WakeMS) * time.Millisecond,
	}, nil
}
