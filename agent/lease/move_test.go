package lease

import (
	"testing"
	"time"

	"github.com/napd/napd/request"
)

// A lease moved to an overflow target counts there, its first model turns
// idle, and its key stays in the first model's scope: a retry for that
// model joins it while it runs and is replayed its answer after; the same
// key sent to the target itself is another request.
func TestTracker_MoveKeepsTheKeyWhereItWasBegun(t *testing.T) {
	tr, c := newTracker(t, Options{}, "b", "cloud")
	req := Request{Model: "b", Client: "alice", Kind: request.Chat, IdempotencyKey: "k1", Fingerprint: "fp"}
	first := begin(t, tr, c.now, req)

	moved, err := tr.Move(c.advance(time.Second), first.ID, "cloud")
	if err != nil || moved.From != "b" || !moved.Idle {
		t.Fatalf("Move = %+v, %v; want from b, idle", moved, err)
	}
	if e := evidence(t, tr, "b"); e.Active != 0 || !e.Since.Equal(c.now) {
		t.Errorf("b after the move: %+v, want idle since the move", e)
	}
	if e := evidence(t, tr, "cloud"); e.Active != 1 {
		t.Errorf("cloud after the move: %+v, want one lease", e)
	}

	retry := begin(t, tr, c.advance(time.Second), req)
	if retry.Verdict != Joined || retry.ID != first.ID {
		t.Fatalf("a retry for b during the overflow: %v, want Joined", retry.Verdict)
	}
	direct := begin(t, tr, c.now, Request{Model: "cloud", Client: "alice", IdempotencyKey: "k1", Fingerprint: "other"})
	if direct.Verdict != Started {
		t.Errorf("the key sent to cloud itself: %v, want Started (another scope)", direct.Verdict)
	}
	end(t, tr, c.now, direct.ID, Outcome{})

	ended := end(t, tr, c.advance(time.Second), first.ID, Outcome{Response: resp(`{"id":"x"}`)})
	if !ended.Stored || !ended.Idle || ended.Lease.Model != "cloud" {
		t.Errorf("End = %+v, want stored, cloud idle", ended)
	}
	select {
	case <-retry.Wait:
	default:
		t.Fatal("the joined retry was not woken")
	}
	if again := begin(t, tr, c.now, req); again.Verdict != Replayed || string(again.Response.Body) != `{"id":"x"}` {
		t.Errorf("the retry asks again: %v, want Replayed", again.Verdict)
	}
}

// Move refuses what it cannot do, and changes nothing then.
func TestTracker_MoveRefuses(t *testing.T) {
	tr, c := newTracker(t, Options{}, "b")
	a := begin(t, tr, c.now, Request{Model: "b"})
	if _, err := tr.Move(c.now, a.ID, "nowhere"); err == nil {
		t.Error("a move to an unregistered model succeeded")
	}
	if _, err := tr.Move(c.now, a.ID+1, "b"); err == nil {
		t.Error("a move of a lease not live succeeded")
	}
	if e := evidence(t, tr, "b"); e.Active != 1 {
		t.Errorf("b: %+v, want its lease still", e)
	}
	if m, err := tr.Move(c.now, a.ID, "b"); err != nil || m.Idle {
		t.Errorf("a move to its own model: %+v, %v", m, err)
	}
}
