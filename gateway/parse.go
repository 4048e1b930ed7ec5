package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/napd/napd/request"
)

// requestFields are the only parts of a body the gateway reads.
type requestFields struct {
	Model  string
	Stream bool
}

// errAmbiguous marks a body whose routing fields the engine could read
// differently from napd: a repeated key, or a case variant ("MODEL").
var errAmbiguous = errors.New("ambiguous")

// parseBody finds `model` and `stream` in a JSON request body. Keys match
// exactly, as the engines read them (encoding/json alone would also take
// "Model"); a repeated or case-variant routing key is errAmbiguous, so napd
// never routes by one spelling while the engine reads another. It walks the
// top-level object in place: no copy of the body, however large. Keys and
// values are compared as raw bytes; only one with an escape is decoded.
func parseBody(body []byte) (requestFields, error) {
	var f requestFields
	if !validJSON(body) {
		// For the message: where and why.
		var v any
		return f, json.Unmarshal(body, &v)
	}
	sc := scanner{b: body}
	if sc.next() != '{' {
		return f, errors.New("want a JSON object")
	}
	sc.i++
	// Per routing field (routingKeys' order): the key token seen first,
	// nil while none, and whether it was the exact spelling.
	var seen [len(routingKeys)][]byte
	var exact [len(routingKeys)]bool
	for {
		tok, val, ok := sc.member()
		if !ok {
			break
		}
		key := tok[1 : len(tok)-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			key = []byte(unquote(tok))
		}
		field := -1
		for i, name := range routingKeys {
			// Unicode folding, as strings.EqualFold: "ſtream" is a variant.
			if bytes.EqualFold(key, name) {
				field = i
			}
		}
		if field < 0 {
			continue
		}
		if seen[field] != nil {
			return f, fmt.Errorf("%w: %q and %q both given", errAmbiguous, unquote(seen[field]), unquote(tok))
		}
		seen[field], exact[field] = tok, bytes.Equal(key, routingKeys[field])
		if !exact[field] {
			continue
		}
		var err error
		if field == 0 {
			err = decodeString(val, &f.Model)
		} else {
			err = decodeBool(val, &f.Stream)
		}
		if err != nil {
			return f, err
		}
	}
	for i, tok := range seen {
		if tok != nil && !exact[i] {
			return f, fmt.Errorf("%w: %q is not %q (keys are case-sensitive)", errAmbiguous, unquote(tok), routingKeys[i])
		}
	}
	return f, nil
}

// routingKeys are the keys parseBody reads: model, then stream.
var routingKeys = [...][]byte{[]byte("model"), []byte("stream")}

// unquote decodes a string token of valid JSON.
func unquote(tok []byte) string {
	var s string
	_ = json.Unmarshal(tok, &s) // valid JSON: it cannot fail
	return s
}

// decodeString stores a string value, as json.Unmarshal would: a plain
// one (no escape, valid UTF-8) straight from its bytes.
func decodeString(val []byte, s *string) error {
	if val[0] == '"' {
		if in := val[1 : len(val)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
			*s = string(in)
			return nil
		}
	}
	v := *s // a copy: only this slow path pays for its escape
	err := json.Unmarshal(val, &v)
	*s = v
	return err
}

// decodeBool stores a bool value, as json.Unmarshal would.
func decodeBool(val []byte, b *bool) error {
	switch string(val) {
	case "true":
		*b = true
		return nil
	case "false":
		*b = false
		return nil
	}
	v := *b
	err := json.Unmarshal(val, &v)
	*b = v
	return err
}

// scanner walks JSON already known to be valid.
type scanner struct {
	b []byte
	i int
}

// member reads the next member of the object the scanner is in: its key
// token (quotes included) and its value; false at the object's end.
func (s *scanner) member() (key, val []byte, ok bool) {
	if s.next() == '}' {
		return nil, nil, false
	}
	if s.b[s.i] == ',' {
		s.i++
		s.next()
	}
	key = s.value()
	s.next() // ':'
	s.i++
	s.next()
	return key, s.value(), true
}

// next skips whitespace and returns the byte there.
func (s *scanner) next() byte {
	s.i = skipSpace(s.b, s.i)
	return s.b[s.i]
}

// value returns the value that starts at s.i and moves past it.
func (s *scanner) value() []byte {
	start, depth := s.i, 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			s.skipString()
			if depth == 0 {
				return s.b[start:s.i]
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return s.b[start:s.i] // the end of the enclosing object
			}
			if depth--; depth == 0 {
				s.i++
				return s.b[start:s.i]
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return s.b[start:s.i] // the end of a number, true, false or null
			}
		}
		s.i++
	}
	return s.b[start:]
}

// skipString moves past the string that starts at s.i, jumping from quote
// to quote: a quote after an odd run of backslashes is escaped.
func (s *scanner) skipString() {
	s.i++
	for {
		q := s.i + bytes.IndexByte(s.b[s.i:], '"')
		bs := 0
		for k := q - 1; k >= s.i && s.b[k] == '\\'; k-- {
			bs++
		}
		s.i = q + 1
		if bs%2 == 0 {
			return
		}
	}
}

// maxDepth is how deep encoding/json lets arrays and objects nest.
const maxDepth = 10000

// validJSON reports whether b is one JSON value, exactly as json.Valid
// does (invalid UTF-8 in strings included, nesting up to maxDepth), at
// several times its speed: a prompt body is often tens of kilobytes.
func validJSON(b []byte) bool {
	var objects [maxDepth/64 + 1]uint64 // bit d: the container at depth d is an object
	depth := 0
	i := skipSpace(b, 0)
	for {
		// A value starts at i.
		if i >= len(b) {
			return false
		}
		switch c := b[i]; c {
		case '{', '[':
			if depth == maxDepth {
				return false
			}
			depth++
			if c == '{' {
				objects[depth/64] |= 1 << (depth % 64)
			} else {
				objects[depth/64] &^= 1 << (depth % 64)
			}
			if i = skipSpace(b, i+1); i < len(b) && b[i] == c+2 { // '}' or ']'
				depth--
				i++
				break
			}
			if c == '{' {
				i = skipKey(b, i)
			}
			if i < 0 {
				return false
			}
			continue
		case '"':
			i = skipJSONString(b, i)
		case 't':
			i = skipLiteral(b, i, "true")
		case 'f':
			i = skipLiteral(b, i, "false")
		case 'n':
			i = skipLiteral(b, i, "null")
		default:
			i = skipNumber(b, i)
		}
		if i < 0 {
			return false
		}
		// After a value: the ends of the containers it closes, then a
		// comma and the next value, or the end of b.
		object := false
		for {
			i = skipSpace(b, i)
			if depth == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			object = objects[depth/64]>>(depth%64)&1 == 1
			if b[i] == ',' {
				break
			}
			if (object && b[i] != '}') || (!object && b[i] != ']') {
				return false
			}
			depth--
			i++
		}
		i = skipSpace(b, i+1)
		if object {
			if i = skipKey(b, i); i < 0 {
				return false
			}
		}
	}
}

// skipSpace moves past JSON's whitespace from b[i].
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipKey moves past a key, its colon and the space after; -1 if there
// is none.
func skipKey(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = skipJSONString(b, i); i < 0 {
		return -1
	}
	if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipSpace(b, i+1)
}

// plainByte marks the bytes a string holds as they are: not a quote, a
// backslash or a control character.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// skipJSONString moves past the string that starts at b[i]; -1 if it is
// not a valid one.
func skipJSONString(b []byte, i int) int {
	i++
	for {
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if i >= len(b) || b[i] < 0x20 {
			return -1
		}
		if b[i] == '"' {
			return i + 1
		}
		// A backslash.
		if i++; i >= len(b) {
			return -1
		}
		switch b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			if i+4 >= len(b) {
				return -1
			}
			for _, h := range b[i+1 : i+5] {
				if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
					return -1
				}
			}
			i += 5
		default:
			return -1
		}
	}
}

// skipLiteral moves past lit at b[i]; -1 if it is not there.
func skipLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// skipNumber moves past the number at b[i]; -1 if there is none.
func skipNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return -1
	case b[i] == '0':
		i++
	case '1' <= b[i] && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || b[i] < '0' || b[i] > '9' {
			return -1
		}
		i = skipDigits(b, i)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return -1
		}
		i = skipDigits(b, i)
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// parseTimeout reads X-Request-Timeout: a Go duration ("30s", "1m30s") or
// a number of seconds ("30", "2.5"). It must be positive, and stay so once
// rounded to nanoseconds: "1e-10" is an error, never "no deadline".
func parseTimeout(s string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		switch {
		case math.IsNaN(secs) || secs <= 0:
			return 0, fmt.Errorf("%s %q: must be a positive duration", HeaderRequestTimeout, s)
		case secs >= math.MaxInt64/float64(time.Second):
			// Longer than any request_timeout: the header only ever shortens.
			return math.MaxInt64, nil
		}
		if d := time.Duration(secs * float64(time.Second)); d > 0 {
			return d, nil
		}
		return 0, fmt.Errorf("%s %q: shorter than a nanosecond", HeaderRequestTimeout, s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a duration like \"30s\" or seconds like \"30\"", HeaderRequestTimeout, s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s %q: must be a positive duration", HeaderRequestTimeout, s)
	}
	return d, nil
}

// kindOf classifies a request by its engine path.
func kindOf(path string) request.Kind {
	switch path {
	case "/v1/chat/completions", "/v1/messages":
		return request.Chat
	case "/v1/completions", "/completion", "/infill":
		return request.Completion
	case "/v1/embeddings", "/embedding":
		return request.Embedding
	}
	return request.Other
}
