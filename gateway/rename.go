package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// A model with served_name is known to its engine by another name: the
// request's model (JSON field, form field or ?model=) is rewritten to it,
// and the answer's model field mapped back to the name the client sent.
// Without served_name nothing here runs and bodies pass byte for byte.

// maxRenamed bounds a JSON answer whose model is mapped back; a larger one
// passes unchanged, so napd never holds more of an answer than this.
const maxRenamed = 8 << 20

// maxSSELine bounds an event-stream line that is mapped back; a longer
// line passes unchanged.
const maxSSELine = 64 << 10

// span is a value's byte range [start, end) in a JSON document.
type span struct{ start, end int }

// valueSpans appends the spans of the values of key in the JSON object doc
// (shifted by base) and, when into is not "", of key in doc's object
// member into (Anthropic's message_start event nests the model there).
// Matching is exact, as the engines read it. ok is false when doc is not
// a JSON object.
func valueSpans(doc []byte, base int, key, into string, out []span) ([]span, bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return out, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return out, false
		}
		name, _ := tok.(string) // object keys are always strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return out, false
		}
		end := int(dec.InputOffset())
		start := end - len(raw)
		switch {
		case name == key:
			out = append(out, span{base + start, base + end})
		case into != "" && name == into && len(raw) > 0 && raw[0] == '{':
			out, _ = valueSpans(raw, base+start, key, "", out)
		}
	}
	if _, err := dec.Token(); err != nil {
		return out, false
	}
	// Nothing may follow the object (json.Unmarshal would refuse it).
	if _, err := dec.Token(); err != io.EOF {
		return out, false
	}
	return out, true
}

// splice replaces each span of doc (in document order) with repl's result.
func splice(doc []byte, spans []span, repl func(value []byte) []byte) []byte {
	out := make([]byte, 0, len(doc)+64)
	last := 0
	for _, s := range spans {
		out = append(out, doc[last:s.start]...)
		out = append(out, repl(doc[s.start:s.end])...)
		last = s.end
	}
	return append(out, doc[last:]...)
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always encodes
	return b
}

// setModel sets every top-level "model" of a JSON request body to served.
func setModel(body []byte, served string) []byte {
	return setField(body, "model", jsonString(served), false)
}

// setPriority sets every top-level "priority" of a JSON request body to
// p, adding one when there is none: the engine sees napd's, never the
// client's (engine_priority).
func setPriority(body []byte, p int) []byte {
	return setField(body, "priority", strconv.AppendInt(nil, int64(p), 10), true)
}

// setField replaces the value of every top-level key of the JSON object
// body with value (JSON text) or, when there is none and add is set,
// adds the key first in the object. A body that is not a JSON object is
// left as it is.
func setField(body []byte, key string, value []byte, add bool) []byte {
	spans, ok := valueSpans(body, 0, key, "", nil)
	switch {
	case !ok, len(spans) == 0 && !add:
		return body
	case len(spans) > 0:
		return splice(body, spans, func([]byte) []byte { return value })
	}
	open := bytes.IndexByte(body, '{') + 1 // a JSON object: found
	member := append(append(jsonString(key), ':'), value...)
	if rest := bytes.TrimLeft(body[open:], " \t\r\n"); rest[0] != '}' {
		member = append(member, ',')
	}
	out := make([]byte, 0, len(body)+len(member))
	return append(append(append(out, body[:open]...), member...), body[open:]...)
}

// mapModel replaces the answer's model (top level, or in "message") when
// it is served, by requested.
func mapModel(doc []byte, served, requested string) []byte {
	spans, ok := valueSpans(doc, 0, "model", "message", nil)
	if !ok || len(spans) == 0 {
		return doc
	}
	q := jsonString(requested)
	return splice(doc, spans, func(v []byte) []byte {
		var s string
		if json.Unmarshal(v, &s) == nil && s == served {
			return q
		}
		return v
	})
}

// mapAnswer maps the model of an engine's answer back to the name the
// client sent: a JSON answer whole (up to maxRenamed), an event stream
// line by line as it passes. Compressed answers pass unchanged.
func (c *call) mapAnswer(resp *http.Response) error {
	if resp.Header.Get("Content-Encoding") != "" {
		return nil
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case ct == "text/event-stream":
		resp.Body = &sseMapper{src: bufio.NewReaderSize(resp.Body, maxSSELine), body: resp.Body, served: c.served, requested: c.requested}
		// Mapping changes the length.
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	case ct == "application/json" || strings.HasSuffix(ct, "+json"):
		doc, err := io.ReadAll(io.LimitReader(resp.Body, maxRenamed+1))
		if err != nil {
			return err
		}
		if len(doc) > maxRenamed {
			resp.Body = readCloser{io.MultiReader(bytes.NewReader(doc), resp.Body), resp.Body}
			return nil
		}
		doc = mapModel(doc, c.served, c.requested)
		resp.Body = readCloser{bytes.NewReader(doc), resp.Body}
		resp.ContentLength = int64(len(doc))
		resp.Header.Set("Content-Length", strconv.Itoa(len(doc)))
	}
	return nil
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// sseMapper maps the model of each `data:` line of an event stream. A
// line is passed on as soon as it is complete, so chunks still leave one
// by one.
type sseMapper struct {
	src               *bufio.Reader
	body              io.Closer
	served, requested string
	pending           []byte
	midLine           bool // the last piece read did not end its line
	err               error
}

func (s *sseMapper) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		line, err := s.src.ReadSlice('\n')
		switch {
		case err == bufio.ErrBufferFull:
			// Longer than maxSSELine: passed as it is, to its end.
			s.pending = append(s.pending[:0], line...)
			s.midLine = true
			continue
		case err != nil:
			s.err = err
		}
		if s.midLine {
			s.pending = append(s.pending[:0], line...)
		} else {
			s.pending = s.mapLine(line)
		}
		s.midLine = false
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// mapLine maps "data: {json}" lines; others are copied.
func (s *sseMapper) mapLine(line []byte) []byte {
	rest, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return append([]byte(nil), line...)
	}
	body := bytes.TrimLeft(rest, " ")
	doc := bytes.TrimRight(body, "\r\n")
	if len(doc) == 0 || doc[0] != '{' {
		return append([]byte(nil), line...)
	}
	out := append([]byte(nil), line[:len(line)-len(body)]...)
	out = append(out, mapModel(doc, s.served, s.requested)...)
	return append(out, body[len(doc):]...)
}

func (s *sseMapper) Close() error { return s.body.Close() }
