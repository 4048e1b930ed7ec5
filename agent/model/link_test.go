package model

import (
	"testing"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/internal/h1"
)

// An engine's pool keeps as many idle connections as the model forwards
// requests at once: more could never be in use together, fewer would be
// closed and opened again under steady load.
func TestHTTPLinkPoolIsSizedByMaxConcurrency(t *testing.T) {
	for _, n := range []int{1, config.DefaultMaxConcurrency, 4096} {
		link := (&Model{}).newLink(&config.Model{MaxConcurrency: n})
		tr, ok := link.Transport(func() bool { return false }).(*h1.Transport)
		if !ok {
			t.Fatalf("max_concurrency %d: transport %T, want *h1.Transport", n, link.Transport(nil))
		}
		if tr.MaxIdle != n {
			t.Errorf("max_concurrency %d: %d idle connections kept, want %d", n, tr.MaxIdle, n)
		}
	}
}
