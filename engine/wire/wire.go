// Package wire is the message format shared by both ends of the engine
// transport: napd (engine/client) and a worker (engine.Serve, or any program
// that speaks it, in any language).
//
// Every ZMQ message is one frame: a type byte followed by one msgpack array
// holding the message's fields in a fixed order. A newer peer may append
// fields to any array; a decoder reads the fields it knows and skips the rest.
// A message type, refusal kind or readiness state this side does not know is
// an error, never guessed at: such a peer speaks a newer protocol, and the
// handshake is where versions are agreed.
package wire

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Type is the first byte of every frame.
type Type byte

// Message types. Directions: N = napd to worker, W = worker to napd.
const (
	TypeHello     Type = 0x01 // N, W: protocol range (first message each way)
	TypeError     Type = 0x02 // N, W: a loud rejection, with a human-readable reason
	TypeHeartbeat Type = 0x03 // N: liveness; the worker answers with Readiness (and Report)
	TypeSubmit    Type = 0x10 // N: one request
	TypeCancel    Type = 0x11 // N: the caller no longer wants a request's reply
	TypeReadiness Type = 0x20 // W: whether work may be sent
	TypeReport    Type = 0x21 // W: queue depth, capacity, rejected count
	TypeChunk     Type = 0x30 // W: a piece of a streamed answer
	TypeAnswer    Type = 0x31 // W: the final answer to a request
	TypeRefusal   Type = 0x32 // W: the final refusal of a request
)

// Refusal kinds (Refusal.Kind).
const (
	KindNoRoom          uint8 = 1
	KindInvalidRequest  uint8 = 2
	KindInferenceFailed uint8 = 3
	KindDeadline        uint8 = 4
)

// Readiness states (Readiness.State).
const (
	StateNotReady uint8 = 0
	StateReady    uint8 = 1
	StateFailed   uint8 = 2
)

// Message is one decoded frame.
type Message interface {
	// Type is the frame's type byte.
	Type() Type
	// fields returns pointers to the fields, in wire order.
	fields() []any
}

// Hello opens a session, sent first by napd and answered by the worker.
// Each side names the protocol versions it speaks; see Negotiate.
type Hello struct {
	MinVersion uint32
	MaxVersion uint32
	Software   string // e.g. "napd", "napd-engine-go"; for error messages
	// HeartbeatMillis and DeadAfterMillis are napd's liveness settings: the
	// worker may end a session whose napd has been silent for DeadAfterMillis.
	// A worker sends 0 for both.
	HeartbeatMillis uint32
	DeadAfterMillis uint32
}

// Error is a loud rejection: the receiver logs Message and treats the
// session as broken.
type Error struct{ Message string }

// Heartbeat asks a worker how it is; it answers with Readiness (echoing
// Seq) and, if it measures anything, Report.
type Heartbeat struct{ Seq uint64 }

// Submit is one request. Deadline is in Unix nanoseconds; 0 means none.
type Submit struct {
	ID          uint64
	Deadline    int64
	ContentType string
	Body        []byte
}

// Cancel withdraws request ID: its reply is no longer wanted.
type Cancel struct{ ID uint64 }

// Readiness says whether work may be sent (State*), with a reason when not.
// Seq is the heartbeat it answers (0 after the handshake), so napd can tell
// a fresh answer from one already on its way.
type Readiness struct {
	State  uint8
	Reason string
	Seq    uint64
}

// Report is a worker's queue state; nil means "not measured", never zero.
type Report struct {
	Depth    *uint64
	Capacity *uint64
	Rejected *uint64
}

// Chunk is one piece of a streamed answer to request ID. The first chunk's
// ContentType is the stream's.
type Chunk struct {
	ID          uint64
	ContentType string
	Data        []byte
}

// Answer is the final answer to request ID; after chunks, Body is the last
// piece of the stream (often empty).
type Answer struct {
	ID          uint64
	ContentType string
	Body        []byte
}

// Refusal is the final refusal of request ID; Kind is one of the Kind*
// constants.
type Refusal struct {
	ID      uint64
	Kind    uint8
	Message string
}

// Type implements Message.
func (*Hello) Type() Type { return TypeHello }

// Type implements Message.
func (*Error) Type() Type { return TypeError }

// Type implements Message.
func (*Heartbeat) Type() Type { return TypeHeartbeat }

// Type implements Message.
func (*Submit) Type() Type { return TypeSubmit }

// Type implements Message.
func (*Cancel) Type() Type { return TypeCancel }

// Type implements Message.
func (*Readiness) Type() Type { return TypeReadiness }

// Type implements Message.
func (*Report) Type() Type { return TypeReport }

// Type implements Message.
func (*Chunk) Type() Type { return TypeChunk }

// Type implements Message.
func (*Answer) Type() Type { return TypeAnswer }

// Type implements Message.
func (*Refusal) Type() Type { return TypeRefusal }

func (m *Hello) fields() []any {
	return []any{&m.MinVersion, &m.MaxVersion, &m.Software, &m.HeartbeatMillis, &m.DeadAfterMillis}
}
func (m *Error) fields() []any     { return []any{&m.Message} }
func (m *Heartbeat) fields() []any { return []any{&m.Seq} }
func (m *Submit) fields() []any    { return []any{&m.ID, &m.Deadline, &m.ContentType, &m.Body} }
func (m *Cancel) fields() []any    { return []any{&m.ID} }
func (m *Readiness) fields() []any { return []any{&m.State, &m.Reason, &m.Seq} }
func (m *Report) fields() []any    { return []any{&m.Depth, &m.Capacity, &m.Rejected} }
func (m *Chunk) fields() []any     { return []any{&m.ID, &m.ContentType, &m.Data} }
func (m *Answer) fields() []any    { return []any{&m.ID, &m.ContentType, &m.Body} }
func (m *Refusal) fields() []any   { return []any{&m.ID, &m.Kind, &m.Message} }

// newMessage returns an empty message of type t, or nil for an unknown type.
func newMessage(t Type) Message {
	switch t {
	case TypeHello:
		return &Hello{}
	case TypeError:
		return &Error{}
	case TypeHeartbeat:
		return &Heartbeat{}
	case TypeSubmit:
		return &Submit{}
	case TypeCancel:
		return &Cancel{}
	case TypeReadiness:
		return &Readiness{}
	case TypeReport:
		return &Report{}
	case TypeChunk:
		return &Chunk{}
	case TypeAnswer:
		return &Answer{}
	case TypeRefusal:
		return &Refusal{}
	}
	return nil
}

// Encode renders m as one frame.
func Encode(m Message) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte(byte(m.Type()))
	enc := msgpack.NewEncoder(&buf)
	fs := m.fields()
	if err := enc.EncodeArrayLen(len(fs)); err != nil {
		return nil, fmt.Errorf("encode message 0x%02x: %w", byte(m.Type()), err)
	}
	for _, f := range fs {
		if err := enc.Encode(f); err != nil {
			return nil, fmt.Errorf("encode message 0x%02x: %w", byte(m.Type()), err)
		}
	}
	return buf.Bytes(), nil
}

// ErrEmpty is returned by Decode for a frame with no type byte.
var ErrEmpty = errors.New("empty frame")

// UnknownTypeError is a frame whose type byte this side does not know.
type UnknownTypeError struct{ Type Type }

func (e *UnknownTypeError) Error() string {
	return fmt.Sprintf("unknown message type 0x%02x (protocol %d–%d): the peer speaks a different protocol", byte(e.Type), MinVersion, MaxVersion)
}

// Decode parses one frame. Fields appended by a newer peer are skipped; a
// frame with fewer fields than this side knows, an unknown type, kind or
// state, or bytes after the payload is an error.
func Decode(frame []byte) (Message, error) {
	if len(frame) == 0 {
		return nil, ErrEmpty
	}
	t := Type(frame[0])
	m := newMessage(t)
	if m == nil {
		return nil, &UnknownTypeError{Type: t}
	}
	r := bytes.NewReader(frame[1:])
	dec := msgpack.NewDecoder(r)
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("decode message 0x%02x: %w", byte(t), err)
	}
	fs := m.fields()
	if n < len(fs) {
		return nil, fmt.Errorf("decode message 0x%02x: %d fields, want at least %d", byte(t), n, len(fs))
	}
	for i, f := range fs {
		if err := dec.Decode(f); err != nil {
			return nil, fmt.Errorf("decode message 0x%02x field %d: %w", byte(t), i, err)
		}
	}
	for range n - len(fs) {
		if err := dec.Skip(); err != nil {
			return nil, fmt.Errorf("decode message 0x%02x trailing field: %w", byte(t), err)
		}
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("decode message 0x%02x: %d bytes after the payload", byte(t), r.Len())
	}
	if err := check(m); err != nil {
		return nil, fmt.Errorf("decode message 0x%02x: %w", byte(t), err)
	}
	return m, nil
}

// check rejects enumerations this side cannot honour.
func check(m Message) error {
	switch m := m.(type) {
	case *Refusal:
		if m.Kind < KindNoRoom || m.Kind > KindDeadline {
			return fmt.Errorf("unknown refusal kind %d", m.Kind)
		}
	case *Readiness:
		if m.State > StateFailed {
			return fmt.Errorf("unknown readiness state %d", m.State)
		}
	}
	return nil
}
