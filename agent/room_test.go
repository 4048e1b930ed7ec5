package agent

import "testing"

// A model going idle asks the make-room desk for a round only while a
// wake waits: with nobody waiting, a request's end must not wake the
// desk's goroutine (it was a scheduling delay on every request's path).
func TestRoomModelIdlePokesOnlyWhileWaiting(t *testing.T) {
	r := newRoom()
	poked := func() bool {
		select {
		case <-r.kick:
			return true
		default:
			return false
		}
	}
	r.modelIdle()
	if poked() {
		t.Fatal("a model's idleness woke the desk with nobody waiting")
	}
	r.mu.Lock()
	r.waits["b"] = &roomWait{}
	r.counted()
	r.mu.Unlock()
	r.modelIdle()
	if !poked() {
		t.Fatal("a model's idleness did not wake the desk while b waits")
	}
	r.mu.Lock()
	delete(r.waits, "b")
	r.counted()
	r.mu.Unlock()
	r.modelIdle()
	if poked() {
		t.Fatal("the desk was woken after the wait ended")
	}
}
