package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func u(n uint64) *uint64 { return &n }

// samples holds one message of every type, with awkward values.
var samples = []Message{
	&Hello{MinVersion: 1, MaxVersion: 2, Software: "napd", HeartbeatMillis: 1000, DeadAfterMillis: 5000},
	&Error{Message: "no \"session\"\n"},
	&Heartbeat{Seq: 42},
	&Submit{ID: 1<<64 - 1, Deadline: -1, ContentType: "application/json", Body: []byte{0, 1, 0xff}},
	&Cancel{ID: 7},
	&Readiness{State: StateFailed, Reason: "CUDA OOM", Seq: 42},
	&Report{Depth: u(0), Capacity: nil, Rejected: u(12)},
	&Chunk{ID: 3, ContentType: "text/event-stream", Data: []byte("data: x\n\n")},
	&Answer{ID: 3, ContentType: "", Body: nil},
	&Refusal{ID: 4, Kind: KindDeadline, Message: "too slow"},
}

func TestDecode_RoundTripsEveryType(t *testing.T) {
	for _, m := range samples {
		frame, err := Encode(m)
		if err != nil {
			t.Fatalf("encode %T: %v", m, err)
		}
		if Type(frame[0]) != m.Type() {
			t.Fatalf("%T: type byte 0x%02x", m, frame[0])
		}
		got, err := Decode(frame)
		if err != nil {
			t.Fatalf("decode %T: %v", m, err)
		}
		if !equal(got, m) {
			t.Errorf("%T: got %+v, want %+v", m, got, m)
		}
	}
}

// equal compares messages treating nil and empty byte slices alike.
func equal(a, b Message) bool {
	ea, _ := Encode(a)
	eb, _ := Encode(b)
	return bytes.Equal(ea, eb) && reflect.TypeOf(a) == reflect.TypeOf(b)
}

// withExtra encodes m's fields followed by extra ones, as a newer peer would.
func withExtra(t *testing.T, m Message, extra ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteByte(byte(m.Type()))
	enc := msgpack.NewEncoder(&buf)
	fs := m.fields()
	if err := enc.EncodeArrayLen(len(fs) + len(extra)); err != nil {
		t.Fatal(err)
	}
	for _, f := range append(fs, extra...) {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestDecode_ToleratesTrailingFields(t *testing.T) {
	want := &Answer{ID: 9, ContentType: "text/plain", Body: []byte("hi")}
	frame := withExtra(t, want, "new field", map[string]int{"nested": 1}, []any{1, "x", nil})
	got, err := Decode(frame)
	if err != nil {
		t.Fatalf("decode with trailing fields: %v", err)
	}
	if !equal(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestDecode_RejectsLoudly(t *testing.T) {
	short := func() []byte {
		var buf bytes.Buffer
		buf.WriteByte(byte(TypeSubmit))
		enc := msgpack.NewEncoder(&buf)
		_ = enc.EncodeArrayLen(2)
		_ = enc.EncodeUint(1)
		_ = enc.EncodeInt(0)
		return buf.Bytes()
	}()
	good, _ := Encode(&Cancel{ID: 1})
	cases := map[string]struct {
		frame []byte
		want  string
	}{
		"empty":          {nil, "empty frame"},
		"unknown type":   {[]byte{0x7f, 0x90}, "unknown message type 0x7f"},
		"short array":    {short, "2 fields, want at least 4"},
		"not an array":   {[]byte{byte(TypeCancel), 0x01}, "decode message 0x11"},
		"trailing bytes": {append(good, 0xc0), "bytes after the payload"},
		"unknown kind":   {mustEncode(t, &Refusal{ID: 1, Kind: 9}), "unknown refusal kind 9"},
		"unknown state":  {mustEncode(t, &Readiness{State: 3}), "unknown readiness state 3"},
		"wrong field":    {withFields(t, TypeCancel, "seven"), "field 0"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(c.frame)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	var ute *UnknownTypeError
	if _, err := Decode([]byte{0x7f}); !errors.As(err, &ute) || ute.Type != 0x7f {
		t.Errorf("unknown type: got %v, want *UnknownTypeError", err)
	}
}

func mustEncode(t *testing.T, m Message) []byte {
	t.Helper()
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func withFields(t *testing.T, typ Type, fields ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteByte(byte(typ))
	if err := msgpack.NewEncoder(&buf).Encode(fields); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestNegotiate(t *testing.T) {
	cases := []struct {
		local, remote Range
		want          uint32
		err           string
	}{
		{Range{1, 2}, Range{1, 1}, 1, ""},
		{Range{1, 2}, Range{2, 5}, 2, ""},
		{Range{1, 2}, Range{3, 3}, 0, "worker speaks protocol 3, napd speaks 1–2: upgrade napd"},
		{Range{2, 3}, Range{1, 1}, 0, "worker speaks protocol 1, napd speaks 2–3: upgrade worker"},
		{Range{1, 1}, Range{2, 1}, 0, "worker speaks protocol 2–1"},
	}
	for _, c := range cases {
		got, err := Negotiate(c.local, c.remote, "napd", "worker")
		if c.err == "" {
			if err != nil || got != c.want {
				t.Errorf("Negotiate(%v, %v) = %d, %v; want %d", c.local, c.remote, got, err, c.want)
			}
			continue
		}
		var ve *VersionError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Negotiate(%v, %v) error = %v; want %q", c.local, c.remote, err, c.err)
		}
	}
}

// FuzzDecode: Decode never panics, and whatever it accepts re-encodes to a
// frame that decodes to the same message.
func FuzzDecode(f *testing.F) {
	for _, m := range samples {
		b, _ := Encode(m)
		f.Add(b)
	}
	f.Add([]byte{byte(TypeSubmit), 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{byte(TypeChunk), 0x93, 0x01, 0xa0, 0xc6, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, frame []byte) {
		m, err := Decode(frame)
		if err != nil {
			return
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("re-encode %T: %v", m, err)
		}
		m2, err := Decode(again)
		if err != nil {
			t.Fatalf("decode re-encoded %T: %v", m, err)
		}
		if !equal(m, m2) {
			t.Fatalf("round trip changed %+v to %+v", m, m2)
		}
	})
}
