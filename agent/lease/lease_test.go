package lease

import (
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/request"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// clock is a hand-advanced clock for tests.
type clock struct{ now time.Time }

func (c *clock) advance(d time.Duration) time.Time { c.now = c.now.Add(d); return c.now }

func newTracker(t *testing.T, opts Options, models ...string) (*Tracker, *clock) {
	t.Helper()
	c := &clock{now: t0}
	tr := NewTracker(opts)
	for _, m := range models {
		tr.Register(m, c.now)
	}
	return tr, c
}

func begin(t *testing.T, tr *Tracker, now time.Time, r Request) Admission {
	t.Helper()
	a, err := tr.Begin(now, r)
	if err != nil {
		t.Fatalf("Begin(%+v): %v", r, err)
	}
	return a
}

func end(t *testing.T, tr *Tracker, now time.Time, id ID, out Outcome) Ended {
	t.Helper()
	e, ok := tr.End(now, id, out)
	if !ok {
		t.Fatalf("End(%d): lease not live", id)
	}
	return e
}

func evidence(t *testing.T, tr *Tracker, model string) Evidence {
	t.Helper()
	e, ok := tr.Evidence(model)
	if !ok {
		t.Fatalf("Evidence(%q): unknown model", model)
	}
	return e
}

func resp(body string) *Stored {
	return &Stored{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// The lease type is the privacy guarantee: if a field is added, this test
// makes someone decide, in review, that it carries no prompt, body,
// completion or credential.
func TestLease_CarriesNoContent(t *testing.T) {
	want := []string{"Client", "End", "ID", "Key", "Kind", "Model", "Start", "Streamed"}
	var got []string
	for f := range reflect.TypeFor[Lease]().Fields() {
		got = append(got, f.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Lease fields = %v, want %v", got, want)
	}
}

func TestTracker_EvidenceIdleSinceLastEnd(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	if e := evidence(t, tr, "m"); e.Active != 0 || !e.Since.Equal(t0) {
		t.Fatalf("never used: %+v, want idle since registration %v", e, t0)
	}
	a := begin(t, tr, c.advance(time.Minute), Request{Model: "m", Kind: request.Chat})
	b := begin(t, tr, c.advance(time.Second), Request{Model: "m", Kind: request.Embedding})
	if e := evidence(t, tr, "m"); e.Active != 2 || e.Idle() {
		t.Fatalf("two live: %+v", e)
	}
	if got := end(t, tr, c.advance(time.Second), a.ID, Outcome{}); got.Idle {
		t.Fatal("first end reported idle while another lease is live")
	}
	endAt := c.advance(5 * time.Minute)
	got := end(t, tr, endAt, b.ID, Outcome{})
	if !got.Idle || got.Lease.Kind != request.Embedding || !got.Lease.End.Equal(endAt) {
		t.Fatalf("last end = %+v", got)
	}
	e := evidence(t, tr, "m")
	if !e.Idle() || !e.Since.Equal(endAt) {
		t.Fatalf("after last end: %+v, want idle since %v (the end, not the start)", e, endAt)
	}
	if _, ok := tr.End(c.now, b.ID, Outcome{}); ok {
		t.Fatal("second End of the same lease succeeded")
	}
	if e := evidence(t, tr, "m"); e.Active != 0 {
		t.Fatalf("double End changed the count: %+v", e)
	}
}

func TestTracker_UnknownModel(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	if _, err := tr.Begin(c.now, Request{Model: "nope"}); err == nil {
		t.Fatal("Begin on an unregistered model succeeded")
	}
	if _, ok := tr.Evidence("nope"); ok {
		t.Fatal("Evidence of an unregistered model")
	}
	tr.Register("m", c.advance(time.Hour)) // re-registering keeps the old idle time
	if e := evidence(t, tr, "m"); !e.Since.Equal(t0) {
		t.Fatalf("re-register moved Since to %v", e.Since)
	}
}

// A queued request and a long stream both hold their lease: the model is
// Active for the whole time, however long, until End.
func TestTracker_QueuedAndStreamingHoldLeases(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	stream := begin(t, tr, c.advance(time.Second), Request{Model: "m", Kind: request.Chat, Stream: true})
	queued := begin(t, tr, c.advance(time.Second), Request{Model: "m", Kind: request.Completion})
	c.advance(2 * time.Hour) // far past any idle timeout
	if e := evidence(t, tr, "m"); e.Active != 2 {
		t.Fatalf("stream and queued request: %+v, want 2 active", e)
	}
	end(t, tr, c.advance(time.Second), queued.ID, Outcome{})
	if e := evidence(t, tr, "m"); e.Active != 1 {
		t.Fatalf("stream alone: %+v", e)
	}
	last := end(t, tr, c.advance(time.Second), stream.ID, Outcome{})
	if !last.Lease.Streamed || !last.Idle {
		t.Fatalf("stream end = %+v", last)
	}
}

// A client that disconnects mid-stream releases its lease and is not
// remembered, so its retry with the same key runs instead of replaying.
func TestTracker_MidStreamDisconnect(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	req := Request{Model: "m", Client: "alice", Kind: request.Chat, Stream: true, IdempotencyKey: "k1"}
	a := begin(t, tr, c.advance(time.Second), req)
	got := end(t, tr, c.advance(time.Second), a.ID, Outcome{Cancelled: true, Response: resp("partial")})
	if got.Stored || !got.Idle {
		t.Fatalf("cancelled end = %+v, want not stored and idle", got)
	}
	retry := begin(t, tr, c.advance(time.Second), req)
	if retry.Verdict != Started || retry.ID == a.ID {
		t.Fatalf("retry after disconnect = %+v, want a new lease", retry)
	}
}

// A retry while the first is in flight joins it (counted once); when the
// first finishes, the joiner asks again and replays its response.
func TestTracker_JoinedRetry(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	req := Request{Model: "m", Client: "alice", Kind: request.Chat, IdempotencyKey: "k1"}
	first := begin(t, tr, c.advance(time.Second), req)
	j1 := begin(t, tr, c.advance(time.Second), req)
	j2 := begin(t, tr, c.now, req)
	for _, j := range []Admission{j1, j2} {
		if j.Verdict != Joined || j.ID != first.ID || j.Wait == nil || closed(j.Wait) {
			t.Fatalf("retry in flight = %+v, want joined to %d and waiting", j, first.ID)
		}
	}
	if e := evidence(t, tr, "m"); e.Active != 1 {
		t.Fatalf("joined retries counted: %+v, want 1 active", e)
	}
	got := end(t, tr, c.advance(time.Second), first.ID, Outcome{Response: resp(`{"ok":1}`)})
	if !got.Stored {
		t.Fatal("finished keyed response not stored")
	}
	if !closed(j1.Wait) || !closed(j2.Wait) {
		t.Fatal("joiners not woken by End")
	}
	again := begin(t, tr, c.now, req)
	if again.Verdict != Replayed || string(again.Response.Body) != `{"ok":1}` || again.Response.Status != 200 {
		t.Fatalf("joiner after finish = %+v, want the replay", again)
	}
	if e := evidence(t, tr, "m"); e.Active != 0 {
		t.Fatalf("replay took a lease: %+v", e)
	}
}

// An ended lease's record is reused by the next Begin: nothing of the old
// lease (its joiners' channel, its key, its start) carries over.
func TestTracker_ReusedRecordStartsClean(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	keyed := Request{Model: "m", Client: "alice", Kind: request.Chat, IdempotencyKey: "k1"}
	first := begin(t, tr, c.advance(time.Second), keyed)
	j := begin(t, tr, c.now, keyed)
	end(t, tr, c.advance(time.Second), first.ID, Outcome{Cancelled: true})
	if !closed(j.Wait) {
		t.Fatal("joiner not woken by End")
	}
	second := begin(t, tr, c.advance(time.Second), Request{Model: "m", Client: "bob", Kind: request.Embedding, IdempotencyKey: "k2"})
	j2 := begin(t, tr, c.now, Request{Model: "m", Client: "bob", Kind: request.Embedding, IdempotencyKey: "k2"})
	if j2.Verdict != Joined || j2.ID != second.ID || closed(j2.Wait) {
		t.Fatalf("join of the second lease = %+v, want joined to %d and waiting", j2, second.ID)
	}
	if again := begin(t, tr, c.now, keyed); again.Verdict != Started || again.ID == second.ID {
		t.Fatalf("first key after its lease ended = %+v, want a new lease", again)
	} else {
		end(t, tr, c.now, again.ID, Outcome{Cancelled: true})
	}
	got := end(t, tr, c.advance(time.Second), second.ID, Outcome{})
	want := Lease{ID: second.ID, Model: "m", Client: "bob", Kind: request.Embedding, Key: "k2",
		Start: t0.Add(3 * time.Second), End: t0.Add(4 * time.Second)}
	if got.Lease != want || !got.Idle || !closed(j2.Wait) {
		t.Fatalf("second lease ended as %+v, want %+v, idle, its joiner woken", got, want)
	}
}

// The primary is cancelled: joiners are woken, nothing is stored, and the
// first joiner to ask again runs; the others join it.
func TestTracker_JoinerRunsWhenPrimaryCancelled(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	req := Request{Model: "m", Client: "alice", Kind: request.Chat, IdempotencyKey: "k1"}
	first := begin(t, tr, c.advance(time.Second), req)
	j1 := begin(t, tr, c.now, req)
	j2 := begin(t, tr, c.now, req)
	if got := end(t, tr, c.advance(time.Second), first.ID, Outcome{Cancelled: true}); got.Stored {
		t.Fatal("cancelled response stored")
	}
	if !closed(j1.Wait) || !closed(j2.Wait) {
		t.Fatal("joiners not woken")
	}
	r1 := begin(t, tr, c.now, req)
	r2 := begin(t, tr, c.now, req)
	if r1.Verdict != Started || r2.Verdict != Joined || r2.ID != r1.ID {
		t.Fatalf("after cancel: %+v then %+v, want started then joined to it", r1, r2)
	}
}

func TestTracker_ReplayedRetry(t *testing.T) {
	tr, c := newTracker(t, Options{MaxAge: time.Minute}, "m", "other")
	req := Request{Model: "m", Client: "alice", Kind: request.Completion, IdempotencyKey: "k1"}
	a := begin(t, tr, c.advance(time.Second), req)
	end(t, tr, c.advance(time.Second), a.ID, Outcome{Response: resp("done")})

	if got := begin(t, tr, c.advance(30*time.Second), req); got.Verdict != Replayed || string(got.Response.Body) != "done" {
		t.Fatalf("retry after finish = %+v, want replay", got)
	}
	// The key is scoped: another client, another model, or no key runs.
	for _, r := range []Request{
		{Model: "m", Client: "bob", IdempotencyKey: "k1"},
		{Model: "other", Client: "alice", IdempotencyKey: "k1"},
		{Model: "m", Client: "alice"},
	} {
		got := begin(t, tr, c.now, r)
		if got.Verdict != Started {
			t.Fatalf("%+v = %v, want started", r, got.Verdict)
		}
		end(t, tr, c.now, got.ID, Outcome{Cancelled: true})
	}
	// An unkeyed response is never stored.
	nk := begin(t, tr, c.now, Request{Model: "m", Client: "alice"})
	if got := end(t, tr, c.now, nk.ID, Outcome{Response: resp("x")}); got.Stored {
		t.Fatal("unkeyed response stored")
	}
	// Past MaxAge the retry runs.
	if got := begin(t, tr, c.advance(time.Minute), req); got.Verdict != Started {
		t.Fatalf("retry after MaxAge = %v, want started", got.Verdict)
	}
	if s := tr.Stats(); s.Stored != 0 || s.StoredBytes != 0 {
		t.Fatalf("expired entry still held: %+v", s)
	}
}

func TestTracker_StoreEvictsOldestFirst(t *testing.T) {
	tr, c := newTracker(t, Options{MaxEntries: 3, MaxBytes: 4096}, "m")
	finish := func(key string, body []byte) Ended {
		a := begin(t, tr, c.advance(time.Second), Request{Model: "m", Client: "c", IdempotencyKey: key})
		return end(t, tr, c.now, a.ID, Outcome{Response: &Stored{Status: 200, Body: body}})
	}
	for _, k := range []string{"a", "b", "c", "d"} {
		finish(k, []byte(k))
	}
	replayed := func(key string) bool {
		a := begin(t, tr, c.now, Request{Model: "m", Client: "c", IdempotencyKey: key})
		if a.Verdict == Started {
			end(t, tr, c.now, a.ID, Outcome{Cancelled: true})
		}
		return a.Verdict == Replayed
	}
	if replayed("a") || !replayed("b") || !replayed("d") {
		t.Fatal("entry bound: want a evicted, b..d kept")
	}
	// A big entry pushes out the oldest until the byte bound holds.
	if got := finish("big", make([]byte, 3000)); !got.Stored {
		t.Fatal("big response under the bound not stored")
	}
	if s := tr.Stats(); s.StoredBytes > 4096 || s.Stored > 3 {
		t.Fatalf("bounds broken: %+v", s)
	}
	if replayed("b") || !replayed("big") {
		t.Fatal("byte bound: want the oldest evicted and the new one kept")
	}
	// Larger than the whole bound: simply not stored, nothing evicted.
	before := tr.Stats()
	if got := finish("huge", make([]byte, 5000)); got.Stored {
		t.Fatal("response over the byte bound stored")
	}
	if after := tr.Stats(); after != before {
		t.Fatalf("oversized response changed the store: %+v -> %+v", before, after)
	}
}

// Memory stays bounded under any traffic: a million keyed requests, mixed
// finishes and cancels over many clients and keys, with retries, joins and
// many leases live at once. Sizes are asserted, not RSS.
func TestTracker_MillionKeyedRequests(t *testing.T) {
	const (
		n          = 1_000_000
		window     = 256 // leases live at once
		maxEntries = 512
		maxBytes   = 256 << 10
	)
	tr, c := newTracker(t, Options{MaxEntries: maxEntries, MaxBytes: maxBytes, MaxAge: time.Minute}, "a", "b")
	body := make([]byte, 4096)
	shared := &Stored{Status: 200, Body: body}
	var ring [window]ID
	var live int
	rng := uint64(1)
	next := func() uint64 { // xorshift: fast, deterministic
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return rng
	}
	models := [2]string{"a", "b"}
	keys := [...]string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	clients := [...]string{"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "c11", "c12", "c13", "c14", "c15"}
	var started, joined, replayed int
	for i := range n {
		now := c.advance(time.Millisecond)
		slot := i % window
		if id := ring[slot]; id != 0 {
			r := next()
			out := Outcome{Cancelled: r%3 == 0}
			if !out.Cancelled {
				out.Response = shared
				if r%5 == 0 { // vary sizes without allocating
					out.Response = &Stored{Status: 200, Body: body[:r%4096]}
				}
			}
			if _, ok := tr.End(now, id, out); !ok {
				t.Fatalf("step %d: End(%d) not live", i, id)
			}
			ring[slot] = 0
			live--
		}
		r := next()
		a, err := tr.Begin(now, Request{
			Model: models[r&1], Client: clients[(r>>1)%16], Kind: request.Chat,
			IdempotencyKey: keys[(r>>5)%8],
		})
		if err != nil {
			t.Fatal(err)
		}
		switch a.Verdict {
		case Started:
			started++
			ring[slot] = a.ID
			live++
		case Joined:
			joined++
		case Replayed:
			replayed++
		}
		if i%4096 == 0 {
			s := tr.Stats()
			ea, eb := evidence(t, tr, "a"), evidence(t, tr, "b")
			if s.Live != live || ea.Active+eb.Active != live || s.Keyed != live ||
				s.Stored > maxEntries || s.StoredBytes > maxBytes || s.StoredBytes < 0 {
				t.Fatalf("step %d: stats %+v, evidence %d+%d, want %d live within bounds", i, s, ea.Active, eb.Active, live)
			}
		}
	}
	if started == 0 || joined == 0 || replayed == 0 {
		t.Fatalf("traffic did not exercise every path: started %d joined %d replayed %d", started, joined, replayed)
	}
	for _, id := range ring {
		if id != 0 {
			end(t, tr, c.now, id, Outcome{Cancelled: true})
		}
	}
	s := tr.Stats()
	if s.Live != 0 || s.Keyed != 0 || len(tr.live) != 0 || len(tr.inflight) != 0 {
		t.Fatalf("after draining: %+v", s)
	}
	if got := tr.Stats(); got.Stored > maxEntries || got.StoredBytes > maxBytes {
		t.Fatalf("store over bounds: %+v", got)
	}
	tr.Begin(c.advance(time.Minute), Request{Model: "a"}) // expires everything
	if got := tr.Stats(); got.Stored != 0 || got.StoredBytes != 0 || len(tr.store.byKey) != 0 {
		t.Fatalf("store not empty after MaxAge: %+v", got)
	}
}

// Many goroutines begin, join and end at once; run with -race. Each joiner
// waits for its primary and must then get a replay or a fresh start.
func TestTracker_ConcurrentUse(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	now := c.now
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				req := Request{Model: "m", Client: "c", IdempotencyKey: []string{"x", "y", ""}[(g+i)%3]}
				a, err := tr.Begin(now, req)
				for err == nil && a.Verdict == Joined {
					<-a.Wait
					a, err = tr.Begin(now, req)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if a.Verdict == Started {
					tr.End(now, a.ID, Outcome{Cancelled: i%2 == 0, Response: resp("r")})
				}
			}
		})
	}
	wg.Wait()
	if e := evidence(t, tr, "m"); e.Active != 0 {
		t.Fatalf("after all ended: %+v", e)
	}
	if s := tr.Stats(); s.Live != 0 || s.Keyed != 0 {
		t.Fatalf("leaked: %+v", s)
	}
}

func TestTracker_KeyReusedForAnotherRequestIsConflict(t *testing.T) {
	tr, c := newTracker(t, Options{}, "m")
	req := Request{Model: "m", Client: "alice", IdempotencyKey: "k1", Fingerprint: "body-a"}
	other := req
	other.Fingerprint = "body-b"

	// In flight: the other request neither joins nor takes a lease.
	a := begin(t, tr, c.advance(time.Second), req)
	if got := begin(t, tr, c.now, other); got.Verdict != Conflict {
		t.Fatalf("other request while the first runs = %v, want conflict", got.Verdict)
	}
	if ev := evidence(t, tr, "m"); ev.Active != 1 {
		t.Fatalf("a conflict took a lease: %+v", ev)
	}
	end(t, tr, c.advance(time.Second), a.ID, Outcome{Response: resp("answer to a")})

	// Stored: the other request never gets the first one's answer.
	if got := begin(t, tr, c.now, other); got.Verdict != Conflict || got.Response != nil {
		t.Fatalf("other request after the first = %+v, want conflict without a response", got)
	}
	if got := begin(t, tr, c.now, req); got.Verdict != Replayed || string(got.Response.Body) != "answer to a" {
		t.Fatalf("the same request = %+v, want its replay", got)
	}
}
