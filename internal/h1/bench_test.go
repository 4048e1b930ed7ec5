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
