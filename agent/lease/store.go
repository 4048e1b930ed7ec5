package lease

import (
	"container/list"
	"time"
)

// Replay store defaults.
const (
	DefaultMaxEntries = 1024
	DefaultMaxBytes   = 64 << 20
	DefaultMaxAge     = 10 * time.Minute
)

// Options bound the replay store. It is memory only: never persisted.
type Options struct {
	// MaxEntries caps the number of stored responses (0 = DefaultMaxEntries).
	MaxEntries int
	// MaxBytes caps their total size (0 = DefaultMaxBytes). A response
	// larger than this on its own is not stored at all.
	MaxBytes int64
	// MaxAge is how long a response stays replayable (0 = DefaultMaxAge).
	MaxAge time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	return o
}

// storeKey scopes an idempotency key to its client and model: another
// client's (or another model's) request with the same key is a different one.
type storeKey struct {
	model, client, key string
}

type entry struct {
	key  storeKey
	fp   string // the fingerprint of the request that produced resp
	resp *Stored
	size int64
	at   time.Time
}

// store is the bounded replay memory. Entries are kept in insertion order,
// which is also age order, so eviction always takes the front. Not safe for
// concurrent use: the Tracker's mutex guards it.
type store struct {
	opts  Options
	order *list.List // of *entry, oldest first
	byKey map[storeKey]*list.Element
	bytes int64
}

func newStore(opts Options) store {
	return store{opts: opts, order: list.New(), byKey: make(map[storeKey]*list.Element)}
}

func (s *store) len() int { return s.order.Len() }

func (s *store) get(k storeKey) (*Stored, string) {
	if el, ok := s.byKey[k]; ok {
		e := el.Value.(*entry)
		return e.resp, e.fp
	}
	return nil, ""
}

// put stores resp under k, evicting the oldest entries until the bounds
// hold. It reports false (and stores nothing) when resp alone is over the
// byte bound.
func (s *store) put(now time.Time, k storeKey, fp string, resp *Stored) bool {
	size := sizeOf(k, resp) + int64(len(fp))
	if size > s.opts.MaxBytes {
		return false
	}
	if el, ok := s.byKey[k]; ok {
		s.remove(el)
	}
	for s.order.Len() >= s.opts.MaxEntries || s.bytes+size > s.opts.MaxBytes {
		s.remove(s.order.Front())
	}
	s.byKey[k] = s.order.PushBack(&entry{key: k, fp: fp, resp: resp, size: size, at: now})
	s.bytes += size
	return true
}

// expire drops entries older than MaxAge at now.
func (s *store) expire(now time.Time) {
	for el := s.order.Front(); el != nil; el = s.order.Front() {
		if now.Sub(el.Value.(*entry).at) < s.opts.MaxAge {
			return
		}
		s.remove(el)
	}
}

func (s *store) remove(el *list.Element) {
	e := s.order.Remove(el).(*entry)
	delete(s.byKey, e.key)
	s.bytes -= e.size
}

// entryOverhead approximates the bookkeeping each entry costs beyond its
// strings and body, so that many tiny responses still count against MaxBytes.
const entryOverhead = 128

func sizeOf(k storeKey, r *Stored) int64 {
	n := int64(entryOverhead + len(k.model) + len(k.client) + len(k.key) + len(r.Body))
	for name, vals := range r.Header {
		n += int64(len(name))
		for _, v := range vals {
			n += int64(len(v))
		}
	}
	return n
}
