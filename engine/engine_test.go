package engine_test

import (
	"testing"

	"github.com/napd/napd/engine"
)

func TestReply_AnsweredHoldsOneFinalAnswer(t *testing.T) {
	r := engine.Answered([]byte("hi"), "text/plain")
	p, ok := <-r
	if !ok || !p.Final() || p.Answer == nil || string(p.Answer.Body) != "hi" || p.Answer.ContentType != "text/plain" {
		t.Fatalf("got %+v, %v", p, ok)
	}
	if _, ok := <-r; ok {
		t.Fatal("reply not closed after its final part")
	}
}

func TestReply_RefusedTravelsTheSamePath(t *testing.T) {
	r := engine.Refused(engine.NoRoom, "full")
	p := <-r
	if !p.Final() || p.Refusal == nil || p.Refusal.Kind != engine.NoRoom || p.Refusal.Message != "full" {
		t.Fatalf("got %+v", p)
	}
	if got := p.Refusal.Error(); got != "no room: full" {
		t.Errorf("Error() = %q", got)
	}
}

func TestReply_AnyChannelIsAReply(t *testing.T) {
	ch := make(chan engine.Part, 2)
	ch <- engine.Part{Chunk: &engine.Chunk{Data: []byte("a")}}
	ch <- engine.Part{Answer: &engine.Answer{}}
	close(ch)
	var r engine.Reply = ch
	first := <-r
	if first.Final() {
		t.Fatal("a chunk is not final")
	}
	if last := <-r; !last.Final() {
		t.Fatal("the answer is final")
	}
}

func TestMeasured_DistinguishesZeroFromAbsent(t *testing.T) {
	rep := engine.Report{Depth: engine.Measured(0)}
	if rep.Depth == nil || *rep.Depth != 0 || rep.Capacity != nil {
		t.Fatalf("got %+v", rep)
	}
}

func TestStrings(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{engine.Ready.String(), "ready"},
		{engine.NotReady.String(), "not ready"},
		{engine.Failed.String(), "failed"},
		{engine.Deadline.String(), "deadline"},
		{engine.InvalidRequest.String(), "invalid request"},
		{engine.InferenceFailed.String(), "inference failed"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
