package gateway

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/napd/napd/internal/mono"
)

// deadlineCtx is a request's context with its deadline (request_timeout,
// X-Request-Timeout), made for the common case that nothing waits on it.
// context.WithTimeout arms a timer and registers with the server's
// context for every request: 7 allocations and over a microsecond, while
// most requests end long before their deadline and what they pass asks
// only Err (napd's engine client, the gateway) or Deadline (admission).
// Err compares the clock with the deadline; Done arms the timer and the
// registration with the parent the first time something waits on it (a
// queued admission, net/http's client, a request napd's engine client
// finds still running). AfterFunc makes context.AfterFunc and contexts
// derived from it register here, where for a context of another type the
// context package starts a goroutine each. It is part of the call.
type deadlineCtx struct {
	context.Context               // the server's request context; no deadline
	at              time.Duration // the deadline, on mono's clock

	mu    sync.Mutex
	err   error         // once set, for good
	done  chan struct{} // made by Done; closed as err is set
	timer *time.Timer
	stop  func() bool // ends the registration with the parent
	after []*afterFunc
}

// afterFunc is one AfterFunc registration: f, unless stopped first.
type afterFunc struct {
	f    func()
	over bool // f started or was stopped
}

func (c *deadlineCtx) init(parent context.Context, d time.Duration) {
	*c = deadlineCtx{Context: parent, at: mono.Now() + d}
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return mono.Time(c.at), true }

func (c *deadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && c.done == nil {
		// Nothing waits: looked at now. Once Done is armed, err is set
		// as its channel closes, so the two never disagree.
		c.err = c.over()
	}
	return c.err
}

// over is why the context is over, looked at now; nil while it is not.
func (c *deadlineCtx) over() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if mono.Now() >= c.at {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err == nil {
		c.err = c.over()
	}
	if c.err != nil {
		close(c.done)
		return c.done
	}
	c.timer = time.AfterFunc(c.at-mono.Now(), func() { c.end(context.DeadlineExceeded) })
	c.stop = context.AfterFunc(c.Context, func() { c.end(c.Context.Err()) })
	return c.done
}

// end ends the context with err, unless it ended already.
func (c *deadlineCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil { // armed by Done, and not ended since
		close(c.done)
		c.timer.Stop()
		c.stop()
	}
	for _, a := range c.after {
		if !a.over {
			a.over = true
			go a.f()
		}
	}
	c.after = nil
}

// AfterFunc runs f in a goroutine of its own once the context is done, as
// context.AfterFunc; stop ends the registration, reporting whether it
// kept f from running.
func (c *deadlineCtx) AfterFunc(f func()) (stop func() bool) {
	c.Done() // arms the timer and the parent's registration
	c.mu.Lock()
	defer c.mu.Unlock()
	a := &afterFunc{f: f}
	if c.err != nil {
		a.over = true
		go f()
	} else {
		c.after = append(c.after, a)
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if a.over {
			return false
		}
		a.over = true
		c.after = slices.DeleteFunc(c.after, func(b *afterFunc) bool { return b == a })
		return true
	}
}

// cancel ends the context when the request's handler is done with it, as
// a CancelFunc.
func (c *deadlineCtx) cancel() { c.end(context.Canceled) }
