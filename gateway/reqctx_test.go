package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/internal/mono"
)

func newDeadlineCtx(parent context.Context, d time.Duration) *deadlineCtx {
	c := &deadlineCtx{}
	c.init(parent, d)
	return c
}

// waitDone fails the test unless ctx's Done closes within 5 s.
func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done did not close")
	}
}

func TestDeadlineCtx(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")

	t.Run("before the deadline", func(t *testing.T) {
		c := newDeadlineCtx(parent, time.Hour)
		if err := c.Err(); err != nil {
			t.Errorf("Err %v", err)
		}
		if dl, ok := c.Deadline(); !ok || dl.Sub(mono.Time(mono.Now()+time.Hour)) > 0 || time.Until(dl) < 59*time.Minute {
			t.Errorf("Deadline %v %v, want an hour from now", dl, ok)
		}
		if c.Value(key{}) != "v" {
			t.Error("the parent's value is lost")
		}
		select {
		case <-c.Done():
			t.Error("Done closed")
		default:
		}
		c.cancel()
		waitDone(t, c)
		if err := c.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("Err after cancel %v", err)
		}
	})
	t.Run("past the deadline, nothing waiting", func(t *testing.T) {
		c := newDeadlineCtx(parent, -time.Second)
		if err := c.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err %v", err)
		}
		c.cancel() // the first error stays
		if err := c.Err(); err != context.DeadlineExceeded || context.Cause(c) != context.DeadlineExceeded {
			t.Errorf("Err %v, Cause %v after cancel", err, context.Cause(c))
		}
		waitDone(t, c) // closed as it is made
	})
	t.Run("the deadline passes while Done waits", func(t *testing.T) {
		c := newDeadlineCtx(parent, 20*time.Millisecond)
		child, stop := context.WithCancel(c)
		defer stop()
		waitDone(t, c)
		if err := c.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err %v", err)
		}
		waitDone(t, child)
		if err := child.Err(); err != context.DeadlineExceeded {
			t.Errorf("derived context: Err %v", err)
		}
	})
	t.Run("the parent ends", func(t *testing.T) {
		for _, armed := range []bool{false, true} {
			p, cancel := context.WithCancel(parent)
			c := newDeadlineCtx(p, time.Hour)
			if armed {
				_ = c.Done()
			}
			cancel()
			waitDone(t, c)
			if err := c.Err(); err != context.Canceled {
				t.Errorf("armed %v: Err %v", armed, err)
			}
		}
	})
	t.Run("AfterFunc", func(t *testing.T) {
		p, cancel := context.WithCancel(parent)
		c := newDeadlineCtx(p, time.Hour)
		ran := make(chan string, 3)
		stopped := context.AfterFunc(c, func() { ran <- "stopped" })
		_ = context.AfterFunc(c, func() { ran <- "ran" })
		child, stopChild := context.WithCancel(c)
		defer stopChild()
		c.mu.Lock()
		registered := len(c.after)
		c.mu.Unlock()
		if registered != 3 {
			// Else the context package watches c with a goroutine each.
			t.Errorf("%d registrations with the context, want 3", registered)
		}
		if !stopped() {
			t.Error("stop before the end: false")
		}
		cancel()
		waitDone(t, child)
		if got := <-ran; got != "ran" {
			t.Errorf("%s ran", got)
		}
		select {
		case got := <-ran:
			t.Errorf("%s ran too", got)
		case <-time.After(20 * time.Millisecond):
		}
		late := make(chan struct{})
		if context.AfterFunc(c, func() { close(late) })() {
			t.Error("stop after the end: true")
		}
		<-late // runs at once on an ended context
	})
	t.Run("concurrent", func(t *testing.T) {
		p, cancel := context.WithCancel(parent)
		defer cancel()
		c := newDeadlineCtx(p, time.Millisecond)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch i % 4 {
				case 0:
					<-c.Done()
				case 1:
					for c.Err() == nil {
					}
				case 2:
					cancel()
				default:
					c.cancel()
				}
			}()
		}
		wg.Wait()
		if c.Err() == nil {
			t.Error("no error")
		}
	})
}
