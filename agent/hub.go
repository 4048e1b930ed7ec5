package agent

import (
	"sync"

	"github.com/napd/napd/agent/control"
)

// hub fans events out to subscribers (napctl events, the ZMQ publisher).
// Publishing never blocks a model's owner loop: a subscriber that does not
// keep up loses events rather than stalling the agent.
type hub struct {
	mu   sync.Mutex
	subs map[chan control.Event]struct{}
}

func newHub() *hub { return &hub{subs: make(map[chan control.Event]struct{})} }

func (h *hub) publish(e control.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- e:
		default:
		}
	}
}

func (h *hub) subscribe() (<-chan control.Event, func()) {
	ch := make(chan control.Event, 256)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs, ch)
			h.mu.Unlock()
		})
	}
}
