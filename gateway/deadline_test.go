package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// deadlineWriter records the deadlines set through http.ResponseController.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	read, write []time.Time
}

func (w *deadlineWriter) SetReadDeadline(t time.Time) error {
	w.read = append(w.read, t)
	return nil
}

func (w *deadlineWriter) SetWriteDeadline(t time.Time) error {
	w.write = append(w.write, t)
	return nil
}

// The write deadline is moved before each write, unless it was less than
// timeout/extendSlack ago: every write gets the timeout less that slack.
func TestRecorderWriteDeadline(t *testing.T) {
	const timeout = time.Minute
	dw := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	before := time.Now()
	w := &recorder{}
	w.init(dw, timeout)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("a"))
	if len(dw.write) != 1 || dw.write[0].Before(before.Add(timeout)) {
		t.Fatalf("deadlines %v, want one, a timeout from the first write", dw.write)
	}
	// As if the slack had passed since.
	w.extended = w.extended.Add(-timeout / extendSlack)
	before = time.Now()
	_, _ = w.Write([]byte("b"))
	if len(dw.write) != 2 || dw.write[1].Before(before.Add(timeout)) {
		t.Fatalf("deadlines %v, want a second one, a timeout from the write", dw.write)
	}
}

// Once the answer is cut at the request's deadline (a stream the client
// may stop reading), no write deadline is set past it, however long the
// write timeout; a cut after the timeout leaves the timeout.
func TestRecorderCutAtDeadline(t *testing.T) {
	const timeout = time.Minute
	dw := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	w := &recorder{}
	w.init(dw, timeout)
	cut := time.Now().Add(6 * time.Second)
	w.cutAt(cut)
	if last := dw.write[len(dw.write)-1]; !last.Equal(cut) {
		t.Fatalf("deadline %v after the cut, want the cut %v", last, cut)
	}
	w.extended = w.extended.Add(-timeout) // the next write moves it again
	_, _ = w.Write([]byte("a"))
	if last := dw.write[len(dw.write)-1]; !last.Equal(cut) {
		t.Fatalf("deadline %v on a write, want the cut %v", last, cut)
	}
	late := time.Now().Add(2 * timeout)
	w.cutAt(late)
	if last := dw.write[len(dw.write)-1]; !last.Before(late) {
		t.Fatalf("deadline %v with a cut after the timeout, want the timeout", last)
	}
}

// The body's read deadline is the idle bound, moved once idle/extendSlack
// passed, until the request's deadline is sooner: then it is that one.
func TestBodyReaderDeadline(t *testing.T) {
	const idle = time.Minute
	dw := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	b := &bodyReader{src: strings.NewReader("abcd"), rc: http.NewResponseController(dw), idle: idle}
	before := time.Now()
	one := make([]byte, 1)
	_, _ = b.Read(one)
	_, _ = b.Read(one)
	if len(dw.read) != 1 || dw.read[0].Before(before.Add(idle)) || !b.idleBound {
		t.Fatalf("deadlines %v, want one, idle from the first read", dw.read)
	}
	b.set = b.set.Add(-idle / extendSlack)
	_, _ = b.Read(one)
	if len(dw.read) != 2 {
		t.Fatalf("deadlines %v, want a second one", dw.read)
	}
	// A request deadline sooner than idle from now is set as it is, once.
	b.deadline = time.Now().Add(idle / 2)
	_, _ = b.Read(one)
	if _, err := b.Read(one); err != io.EOF {
		t.Fatalf("%v, want EOF", err)
	}
	if len(dw.read) != 3 || !dw.read[2].Equal(b.deadline) || b.idleBound {
		t.Fatalf("deadlines %v, want the request's %v last", dw.read, b.deadline)
	}
}
