package httpfixture

import (
	"bytes"
	"path/filepath"
	"strconv"
	"testing"
)

// Every recorded answer parses, and a recorded Content-Length is the
// body's length (where no file path was rewritten, which changed it): the
// reader neither loses nor adds a byte.
func TestLoad_Recorded(t *testing.T) {
	files, _ := filepath.Glob("../../testdata/llamacpp/*.http")
	router, _ := filepath.Glob("../../testdata/llamacpp/router/*.http")
	files = append(files, router...)
	if len(files) < 20 {
		t.Fatalf("found %d recorded answers; want the whole set", len(files))
	}
	for _, f := range files {
		r := Load(t, f)
		if r.Status < 200 || r.Header.Get("Server") != "llama.cpp" {
			t.Errorf("%s: status %d, Server %q", f, r.Status, r.Header.Get("Server"))
		}
		if cl := r.Header.Get("Content-Length"); cl != "" && !bytes.Contains(r.Body, []byte("/srv/models")) {
			if n, _ := strconv.Atoi(cl); n != len(r.Body) {
				t.Errorf("%s: Content-Length %s, body %d bytes", f, cl, len(r.Body))
			}
		}
	}
}

func TestParse_Malformed(t *testing.T) {
	for _, in := range []string{"", "HTTP/1.1 200 OK\nServer: x", "HTP 200\n\nbody", "HTTP/1.1 abc\n\n", "HTTP/1.1 200 OK\nno colon\n\n"} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%q) succeeded", in)
		}
	}
}
