package h1

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
)

// BenchmarkRoundTrip: a small JSON request from the Transport to the
// Server and its answer of unknown length, on one keep-alive connection,
// as a proxy's hops have them; the allocations are both ends'.
func BenchmarkRoundTrip(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	answer := []byte(`{"id":"cmpl-1","choices":[{"text":"hello"}]}`)
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	})}
	go func() { _ = s.Serve(ln) }()
	defer s.Close()
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	body := []byte(`{"model":"m1","prompt":"Say hello","max_tokens":8}`)
	url := "http://" + ln.Addr().String() + "/v1/completions"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	buf := make([]byte, 256)
	b.ReportAllocs()
	for b.Loop() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		for err == nil {
			_, err = resp.Body.Read(buf)
		}
		resp.Body.Close()
		if err != io.EOF {
			b.Fatal(err)
		}
	}
}

// clientHead is a chat request's head as an OpenAI SDK sends it.
const clientHead = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n" +
	"Accept: application/json\r\nContent-Type: application/json\r\nUser-Agent: OpenAI/Python 1.54.0\r\nX-Stainless-Lang: python\r\n" +
	"X-Stainless-Package-Version: 1.54.0\r\nAuthorization: Bearer sk-napd-0123456789abcdef\r\nContent-Length: 96\r\n\r\n"

// BenchmarkServerParse: the Server's reading of a request head.
func BenchmarkServerParse(b *testing.B) {
	c := &serverConn{s: &Server{}, ctx: context.Background()}
	head := []byte(clientHead)
	b.ReportAllocs()
	for b.Loop() {
		ex, ok := c.parse(head)
		if !ok {
			b.Fatal("refused")
		}
		ex.cancel()
	}
}

// discardConn takes every write.
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkServerAnswer: the Server's head and body of a small answer of
// unknown length, as the gateway forwards an engine's.
func BenchmarkServerAnswer(b *testing.B) {
	c := &serverConn{s: &Server{}, bodyDone: true}
	c.nc = discardConn{}
	c.rw = c.nc
	c.cw.c = c
	c.wd.nc, c.wd.write = c.nc, true
	req := &http.Request{Method: http.MethodPost}
	answer := []byte(`{"id":"cmpl-1","choices":[{"text":"hello"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		w := &response{c: c, req: req, header: make(http.Header), cl: -1}
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Server"] = []string{"uvicorn"}
		h["X-Request-Id"] = []string{"chatcmpl-7f3a9c2e4b1d4e0f"}
		h["X-Napd-Model"] = []string{"m1"}
		_, _ = w.Write(answer)
		w.finish()
		if w.err != nil {
			b.Fatal(w.err)
		}
	}
}
