package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// maxProxyAllocs bounds what the gateway adds to the allocations of a
// small non-streamed request (the same request straight to the engine is
// subtracted: client and engine allocate alike on both paths). A
// regression guard for the proxy hot path (docs/bench.md), not a timing:
// a change that adds allocations per request has to raise it on purpose.
const maxProxyAllocs = 160

func TestProxyAllocs(t *testing.T) {
	direct, front := benchSetup(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"hello"}]}`)
	})
	const body = `{"model":"m1","prompt":"Say hello","max_tokens":8}`
	client := &http.Client{Transport: benchTransport()}
	defer client.CloseIdleConnections()
	perRequest := func(url string) float64 {
		send := func() {
			resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		for range 20 { // connections, pools and caches
			send()
		}
		return testing.AllocsPerRun(300, send)
	}
	d, g := perRequest(direct), perRequest(front)
	if added := g - d; added > maxProxyAllocs {
		t.Errorf("the gateway adds %.0f allocations per request (%.0f through it, %.0f direct), want ≤ %d", added, g, d, maxProxyAllocs)
	}
	t.Logf("%.0f allocations per request through the gateway, %.0f direct", g, d)
}
