package control

import "sync"

// Hub fans events out to subscribers (napctl events, /napd/v1/events, the
// ZMQ publisher). Publishing never blocks a model's owner loop: a
// subscriber that does not keep up loses events rather than stalling napd.
type Hub struct {
	mu   sync.Mutex
	subs map[chan Event]struct{}
}

// NewHub returns a hub without subscribers.
func NewHub() *Hub { return &Hub{subs: make(map[chan Event]struct{})} }

// Publish hands e to every subscriber that has room for it.
func (h *Hub) Publish(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- e:
		default:
		}
	}
}

// Subscribe returns a channel of the events published from now on (256
// buffered) and the function that ends the subscription.
func (h *Hub) Subscribe() (<-chan Event, func()) {
	ch := make(chan Event, 256)
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

// Changes is a signal after every event published from now on, coalesced
// (one waiting signal says it all), and the function that ends it.
func (h *Hub) Changes() (<-chan struct{}, func()) {
	events, unsubscribe := h.Subscribe()
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-events:
				select {
				case out <- struct{}{}:
				default:
				}
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return out, func() { once.Do(func() { close(done); unsubscribe() }) }
}
