package gateway

import (
	"net/http"
	"testing"
)

// maxProxyAllocs bounds what the gateway, served and forwarded as the
// agent does (net/http's server, http.Transport, ReverseProxy), adds to
// the allocations of a small non-streamed request (118 when last set, 125
// under -race): about a third each for the server's request, the
// transport's round trip and the proxy's copy of the request and its
// header, and the rest napd's (the deadline's context, the call, the
// admission); the same request straight to the engine is subtracted. A
// regression guard (docs/bench.md), not a timing: a change that adds
// allocations per request has to raise it on purpose.
const maxProxyAllocs = 130

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
