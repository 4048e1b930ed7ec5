package model

import (
	"testing"

	"net/http"

	"github.com/napd/napd/agent/config"
)

// An engine's pool keeps as many idle connections as the model forwards
// requests at once: more could never be in use together, fewer would be
// closed and opened again under steady load.
func TestHTTPLinkPoolIsSizedByMaxConcurrency(t *testing.T) {
	for _, n := range []int{1, config.DefaultMaxConcurrency, 4096} {
		link := (&Model{}).newLink(&config.Model{MaxConcurrency: n})
		tr, ok := link.Transport(func() bool { return false }).(*http.Transport)
		if !ok {
			t.Fatalf("max_concurrency %d: transport %T, want *http.Transport", n, link.Transport(nil))
		}
		if tr.MaxIdleConnsPerHost != n {
			t.Errorf("max_concurrency %d: %d idle connections kept, want %d", n, tr.MaxIdleConnsPerHost, n)
		}
	}
}
