package gateway

import "sync"

// Defaults of the StreamLimit: event streams open at once in all, and per
// client.
const (
	DefaultMaxStreams       = 256
	DefaultStreamsPerClient = 8
)

// StreamLimit bounds the long-lived event streams (GET /models/sse) a
// gateway holds open: in all, and per client (an API key's name, or the
// client's address without keys), so that no client can hold them all.
// One limit serves every gateway of a napd, across reloads.
type StreamLimit struct {
	total, perClient int

	mu  sync.Mutex
	n   int
	per map[string]int
}

// NewStreamLimit returns a limit of total streams, perClient of them per
// client; a bound <= 0 is its default.
func NewStreamLimit(total, perClient int) *StreamLimit {
	if total <= 0 {
		total = DefaultMaxStreams
	}
	if perClient <= 0 {
		perClient = DefaultStreamsPerClient
	}
	return &StreamLimit{total: total, perClient: perClient, per: map[string]int{}}
}

func (l *StreamLimit) acquire(client string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= l.total || l.per[client] >= l.perClient {
		return false
	}
	l.n++
	l.per[client]++
	return true
}

func (l *StreamLimit) release(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.per[client]--; l.per[client] <= 0 {
		delete(l.per, client)
	}
}

func (l *StreamLimit) open(client string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.per[client]
}
