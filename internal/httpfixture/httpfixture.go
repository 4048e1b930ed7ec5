// Package httpfixture reads recorded HTTP answers (testdata/llamacpp's
// .http files): a status line, header lines, a blank line and the body,
// with a chunked body stored decoded, so that net/http's own reader,
// which would decode the chunks again, cannot read them.
//
// It is for tests only: napd must not import it.
package httpfixture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/textproto"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Response is one recorded answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Parse reads a recorded answer.
func Parse(data []byte) (*Response, error) {
	head, body, ok := bytes.Cut(data, []byte("\n\n"))
	if !ok {
		return nil, fmt.Errorf("no blank line after the header")
	}
	lines := strings.Split(strings.ReplaceAll(string(head), "\r", ""), "\n")
	proto, rest, _ := strings.Cut(lines[0], " ")
	code, _, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(code)
	if !strings.HasPrefix(proto, "HTTP/") || err != nil {
		return nil, fmt.Errorf("bad status line %q", lines[0])
	}
	r := &Response{Status: status, Header: http.Header{}, Body: body}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return nil, fmt.Errorf("bad header line %q", l)
		}
		r.Header.Add(textproto.CanonicalMIMEHeaderKey(k), strings.TrimSpace(v))
	}
	return r, nil
}

// Load reads the recorded answer at path, failing the test when it cannot.
func Load(t testing.TB, path string) *Response {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return r
}

// JSON decodes a JSON document (a recorded body, or an answer to compare
// with one), failing the test when it is not one.
func JSON(t testing.TB, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return v
}

// Serve writes r as the answer to a request: its headers but those that
// describe the recorded connection and framing, its status and its body.
func (r *Response) Serve(w http.ResponseWriter) {
	for k, vs := range r.Header {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive":
			continue
		}
		w.Header()[k] = vs
	}
	w.WriteHeader(r.Status)
	w.Write(r.Body)
}
