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
	if !json.Valid(body) {
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
	for sc.next() != '}' {
		if sc.b[sc.i] == ',' {
			sc.i++
			sc.next()
		}
		tok := sc.value()
		sc.next() // ':'
		sc.i++
		sc.next()
		val := sc.value()
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
	return json.Unmarshal(val, s)
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
	return json.Unmarshal(val, b)
}

// scanner walks JSON already known to be valid.
type scanner struct {
	b []byte
	i int
}

// next skips whitespace and returns the byte there.
func (s *scanner) next() byte {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
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
