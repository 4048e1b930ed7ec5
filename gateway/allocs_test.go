package gateway

import (
	"net/http"
	"testing"
)

// maxProxyAllocs bounds what the gateway, served by napd's own HTTP/1.1
// server as the agent serves it, adds to the allocations of a small
// non-streamed request (21 when last lowered, 24 under -race: internal/h1's
// Transport watches for cancellation without context.AfterFunc, and the
// call holds its recorder, engine request and body reader, h1's requests
// go without a 1xx trace or GetBody, the engine's request takes over the
// client's header map and the engine's answer's fields pass on as an
// h1.Head, with no header map; the same request straight to the engine is
// subtracted: client and engine allocate alike on both paths). A
// regression guard for the proxy hot path (docs/bench.md), not a timing:
// a change that adds allocations per request has to raise it on purpose.
const maxProxyAllocs = 26

func TestProxyAllocs(t *testing.T) {
	direct, front := benchSetup(t, smallEngine)
	client := &http.Client{Transport: benchTransport()}
	defer client.CloseIdleConnections()
	perRequest := func(url string) float64 {
		send := func() {
			if err := postSmall(client, url); err != nil {
				t.Fatal(err)
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
