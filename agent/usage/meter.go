// Package usage is napd's account of who used the box: per API key and
// model, the GPU memory held on the key's behalf over time, the wakes and
// swaps its requests caused and the tokens in and out, by hour and in
// total, kept in a bounded state file (usage.json under state_dir) across
// restarts, and the day's use of each key for its quotas.
//
// The rule (docs/keys.md#gpu-time): while a model serves requests, its
// footprint (the GPU memory its engine holds, as measured) is shared
// among the keys of the requests in flight, each key's share being its
// part of them; a key is charged its share of the footprint for as long
// as that holds: byte-seconds, and GPU-seconds (the footprint as a part
// of its GPUs' memory). A model holding memory with nothing in flight
// charges nobody.
//
// meter is that integral for one model, pure: it is handed the time and
// the evidence and hands out the charges. Ledger keeps them; it has one
// mutex, and its callers (the model loops, the gateway's observations,
// napd's ticker) never wait on anything else under it.
package usage

import "time"

// sink receives a meter's charges.
type sink interface {
	charge(model, key string, byteSeconds, gpuSeconds float64)
}

// meter integrates one model's footprint over the keys of its requests in
// flight. The zero meter holds nothing and has nothing in flight.
type meter struct {
	at       time.Time // the last event
	bytes    float64   // the footprint
	gpus     float64   // the footprint as whole GPUs
	inflight map[string]int
	total    int
}

// advance charges the time since the last event to the keys in flight,
// each its share, into s; now before the last event charges nothing.
func (m *meter) advance(now time.Time, model string, s sink) {
	if d := now.Sub(m.at).Seconds(); d > 0 && m.total > 0 && (m.bytes > 0 || m.gpus > 0) {
		for key, n := range m.inflight {
			share := float64(n) / float64(m.total) * d
			s.charge(model, key, m.bytes*share, m.gpus*share)
		}
	}
	if now.After(m.at) {
		m.at = now
	}
}

// begin is a request of key starting to hold the engine at now (its
// grant); the time before it is charged first.
func (m *meter) begin(now time.Time, model, key string, s sink) {
	m.advance(now, model, s)
	if m.inflight == nil {
		m.inflight = make(map[string]int)
	}
	m.inflight[key]++
	m.total++
}

// end is a request of key that stopped holding the engine at now.
func (m *meter) end(now time.Time, model, key string, s sink) {
	m.advance(now, model, s)
	if m.inflight[key] == 0 {
		return // not begun: nothing to end
	}
	if m.inflight[key]--; m.inflight[key] == 0 {
		delete(m.inflight, key)
	}
	m.total--
}

// resize sets the footprint from now: bytes, and gpus, the footprint as
// whole GPUs (see GPUShare).
func (m *meter) resize(now time.Time, model string, bytes int64, gpus float64, s sink) {
	m.advance(now, model, s)
	m.bytes, m.gpus = float64(max(bytes, 0)), max(gpus, 0)
}

// GPUShare is a footprint of bytes spread evenly over gpus as whole GPUs:
// the sum, over its GPUs, of its share there over that GPU's memory
// (totals by GPU index). A GPU whose size is unknown counts whole.
func GPUShare(bytes int64, gpus []int, totals map[int]int64) float64 {
	if len(gpus) == 0 || bytes <= 0 {
		return 0
	}
	per := float64(bytes) / float64(len(gpus))
	var share float64
	for _, g := range gpus {
		if t := totals[g]; t > 0 {
			share += min(per/float64(t), 1)
		} else {
			share++
		}
	}
	return share
}
