package gateway

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// benchTransport is the clients' transport.
func benchTransport() *http.Transport {
	return &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true}
}

// benchSetup serves engine and a gateway in front of it, whose Done calls
// are drained, and returns both URLs.
func benchSetup(b testing.TB, engine http.HandlerFunc) (direct, gateway string) {
	eng := httptest.NewServer(engine)
	b.Cleanup(eng.Close)
	models := newFakeModels(b, eng.URL)
	models.done = make(chan Outcome, 1)
	models.forget = true
	drain := make(chan struct{})
	b.Cleanup(func() { close(drain) })
	go func() {
		for {
			select {
			case <-models.done:
			case <-drain:
				return
			}
		}
	}()
	// With the agent's default request_timeout: each request's deadline
	// is part of its cost.
	gw := New(Options{MaxBody: 64 << 20, RequestTimeout: 10 * time.Minute, Logger: slog.New(slog.DiscardHandler)}, models)
	// Served as the agent serves it, with its timeouts (their deadlines
	// are part of each request's cost).
	return eng.URL, serveGateway(b, gw.Handler(), nil).URL
}

// smallBody is the small non-streamed request of BenchmarkProxy and
// TestProxyAllocs.
const smallBody = `{"model":"m1","prompt":"Say hello","max_tokens":8}`

// smallEngine answers smallBody as a minimal engine would.
func smallEngine(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"hello"}]}`)
}

// postSmall sends smallBody to base's /v1/completions and reads the answer.
func postSmall(client *http.Client, base string) error {
	resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(smallBody))
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// BenchmarkProxy compares a small non-streamed request sent straight to a
// loopback engine with the same request through the gateway; the
// difference is the gateway's cost.
func BenchmarkProxy(b *testing.B) {
	direct, front := benchSetup(b, smallEngine)
	for _, c := range []struct{ name, url string }{
		{"direct", direct},
		{"gateway", front},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: benchTransport()}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := postSmall(client, c.url); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkFormUpload sends a 4 MiB transcription form straight to a
// loopback engine and through the gateway, with the model field before
// the file (streamed) and after it (spooled first); MB/s is the upload's.
func BenchmarkFormUpload(b *testing.B) {
	direct, front := benchSetup(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"text":"ok"}`)
	})
	file := bytes.Repeat([]byte{7}, 4<<20)
	for _, c := range []struct {
		name, url string
		order     []string
	}{
		{"direct", direct, []string{"model", "@file"}},
		{"gateway/model-first", front, []string{"model", "@file"}},
		{"gateway/model-last", front, []string{"@file", "model"}},
	} {
		body, ct := formBody(b, c.order, map[string]string{"model": "m1"}, file)
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: benchTransport()}
			defer client.CloseIdleConnections()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(c.url+"/v1/audio/transcriptions", ct, bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
