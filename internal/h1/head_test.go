package h1

import (
	"bufio"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// readTestHead reads answer's fields as a Head.
func readTestHead(t *testing.T, answer string) *Head {
	t.Helper()
	a, err := readAnswer(bufio.NewReader(strings.NewReader(answer)), &http.Request{Method: "POST"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if a.resp.Header != nil {
		t.Fatalf("an answer read as a Head has a Header: %v", a.resp.Header)
	}
	return &a.head
}

// A Head reads and edits fields as an http.Header does, in the order
// they came.
func TestHead(t *testing.T) {
	h := readTestHead(t, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-multi: a\r\nDate: d\r\nX-Multi: b\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok")
	if h.Len() != 6 || h.Get("Content-Type") != "application/json" || h.Get("X-None") != "" || !h.Has("Date") || h.Has("Server") {
		t.Fatalf("%+v", h)
	}
	if got := h.Values("X-Multi"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("X-Multi %q", got)
	}
	if got := h.Values("Content-Length"); !slices.Equal(got, []string{"2"}) || h.Values("X-None") != nil {
		t.Errorf("Content-Length %q", got)
	}
	// A value list is the head's own: appending to it does not write there.
	_ = append(h.Values("Content-Type"), "x")
	h.Del("X-Multi")
	h.Set("date", "e")
	h.Add("x-added", "1")
	h.DelFunc(func(k string) bool { return k == "Connection" })
	want := http.Header{"Content-Type": {"application/json"}, "Content-Length": {"2"}, "Date": {"e"}, "X-Added": {"1"}}
	if got := h.Header(); !reflect.DeepEqual(got, want) || h.Len() != 4 {
		t.Errorf("after the edits %v (%d fields), want %v", got, h.Len(), want)
	}
	var order []string
	h.each(func(k string, vs []string) { order = append(order, k+"="+strings.Join(vs, ",")) })
	if want := []string{"Content-Type=application/json", "Content-Length=2", "Date=e", "X-Added=1"}; !slices.Equal(order, want) {
		t.Errorf("fields in the order %q, want %q", order, want)
	}
}

// An answer of more fields than the answer's room has them all.
func TestHeadManyFields(t *testing.T) {
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\n")
	for i := range answerValues * 3 {
		b.WriteString("X-F" + strings.Repeat("a", i) + ": v\r\n")
	}
	b.WriteString("Content-Length: 0\r\n\r\n")
	h := readTestHead(t, b.String())
	if h.Len() != answerValues*3+1 || h.Get("X-F"+strings.Repeat("a", answerValues*3-1)) != "v" {
		t.Fatalf("%d fields: %v", h.Len(), h.Header())
	}
}

// A handler may hand its answer an engine's answer's Head (TakeHead): its
// fields go out in the order they came, framed by the server; one that
// declares trailers or has no Content-Type is refused, as is one after
// the answer's header was asked for; asked for after, the header is the
// Head's, as an http.Header.
func TestServerTakeHead(t *testing.T) {
	const engine = "HTTP/1.1 200 OK\r\nx-b: 2\r\ncontent-type: application/json\r\nx-a: 1\r\ncontent-length: 2\r\n\r\n"
	ts := startServer(t, func(w http.ResponseWriter, r *http.Request) {
		answer := engine
		switch r.URL.Path {
		case "/trailer":
			answer = strings.Replace(answer, "x-a: 1", "trailer: x-sum", 1)
		case "/untyped":
			answer = strings.Replace(answer, "content-type: application/json", "x-c: 3", 1)
		case "/asked":
			w.Header().Set("X-Own", "yes")
		}
		a, err := readAnswer(bufio.NewReader(strings.NewReader(answer+"{}")), r, true)
		if err != nil {
			t.Error(err)
			return
		}
		rw := w.(*response)
		taken := rw.TakeHead(&a.head)
		if r.URL.Path == "/header" {
			w.Header().Set("X-Header", w.Header().Get("X-A"))
		}
		if !taken {
			w.Header().Set("X-Refused", "yes")
		}
		_, _ = io.Copy(w, a.resp.Body)
	})
	c := dialServer(t, ts.addr)
	c.send(get("/take"))
	var head []string
	for {
		line, err := c.br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
		if name, _, _ := strings.Cut(line, ":"); !strings.HasPrefix(line, "HTTP/") && name != "Date" {
			head = append(head, strings.TrimSpace(line))
		}
	}
	if want := []string{"X-B: 2", "Content-Type: application/json", "X-A: 1", "Content-Length: 2"}; !slices.Equal(head, want) {
		t.Errorf("head %q, want %q", head, want)
	}
	if b, _ := c.br.Peek(2); string(b) != "{}" {
		t.Fatalf("body %q", b)
	}
	_, _ = c.br.Discard(2)
	for _, path := range []string{"/trailer", "/untyped", "/asked", "/header"} {
		c.send(get(path))
		resp, body := c.answer("GET")
		refused := path != "/header"
		if body != "{}" || (resp.Header.Get("X-Refused") == "yes") != refused || resp.Header.Get("Date") == "" {
			t.Errorf("%s: %v %q", path, resp.Header, body)
		}
		if path == "/header" && (resp.Header.Get("X-Header") != "1" || resp.Header.Get("X-B") != "2" || resp.ContentLength != 2) {
			t.Errorf("%s: the header asked for after TakeHead: %v", path, resp.Header)
		}
	}
}
