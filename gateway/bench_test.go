package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// benchTransport is tuned like the agent's per-engine transports.
func benchTransport() *http.Transport {
	return &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true}
}

// BenchmarkProxy compares a small non-streamed request sent straight to a
// loopback engine with the same request through the gateway; the
// difference is the gateway's cost.
func BenchmarkProxy(b *testing.B) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"hello"}]}`)
	}))
	defer engine.Close()
	models := newFakeModels(b, engine.URL)
	models.transport = benchTransport()
	models.done = make(chan Outcome, 1)
	drain := make(chan struct{})
	defer close(drain)
	go func() {
		for {
			select {
			case <-models.done:
			case <-drain:
				return
			}
		}
	}()
	gw := New(Options{MaxBody: 16 << 20, Logger: slog.New(slog.DiscardHandler)}, models)
	front := httptest.NewServer(gw.Handler())
	defer front.Close()

	const body = `{"model":"m1","prompt":"Say hello","max_tokens":8}`
	for _, c := range []struct{ name, url string }{
		{"direct", engine.URL},
		{"gateway", front.URL},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: benchTransport()}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Post(c.url+"/v1/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		})
	}
}
