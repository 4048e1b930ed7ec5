// Package notify speaks sd_notify to systemd for napd: READY=1 once napd
// serves, RELOADING=1 around a reload, STOPPING=1, WATCHDOG=1 pings while
// napd is healthy, and the STATUS= line systemctl status shows, kept
// current. Outside systemd (no NOTIFY_SOCKET) every call is a no-op: not
// being supervised is not an error.
package notify

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/napd/napd/agent/lifecycle"
)

// Notifier sends napd's notifications.
type Notifier struct {
	log  *slog.Logger
	kick chan struct{} // buffered 1: refresh the STATUS= line now
}

// New returns a notifier that logs its failures to log.
func New(log *slog.Logger) *Notifier { return &Notifier{log: log, kick: make(chan struct{}, 1)} }

func (n *Notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify failed", "state", state, "err", err)
	}
}

// Ready tells systemd napd serves (at start, and when a reload ended).
func (n *Notifier) Ready() { n.send(daemon.SdNotifyReady) }

// Stopping tells systemd napd stops.
func (n *Notifier) Stopping() { n.send(daemon.SdNotifyStopping) }

// Reloading tells systemd a reload began; MONOTONIC_USEC lets systemd match
// the READY=1 that ends it (Type=notify-reload semantics, harmless for
// notify).
func (n *Notifier) Reloading() {
	n.send(daemon.SdNotifyReloading + "\n" + daemon.SdNotifyMonotonicUsec())
}

// Watchdog pings systemd at half the configured interval until ctx ends.
// healthy is asked before each ping so a wedged napd stops pinging and
// systemd restarts it.
func (n *Notifier) Watchdog(ctx context.Context, healthy func() error) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval == 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := healthy(); err != nil {
				n.log.Error("watchdog: not pinging", "err", err)
				continue
			}
			n.send(daemon.SdNotifyWatchdog)
		}
	}
}

// Kick asks Status to refresh the STATUS= line now. It does not block.
func (n *Notifier) Kick() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// Status keeps systemd's STATUS= line current until ctx ends: line() is
// sent when it changed, after each Kick and every 5 seconds, at most five
// times a second.
func (n *Notifier) Status(ctx context.Context, line func() string) {
	last := ""
	refresh := time.NewTicker(5 * time.Second)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		case <-refresh.C:
		}
		if l := line(); l != last {
			n.send("STATUS=" + l)
			last = l
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Line is the STATUS= text systemctl status shows: awake and asleep
// always, the other states only when some model is in them, in a fixed
// order, then the requests in flight.
func Line(states map[lifecycle.State]int, total, inFlight int) string {
	s := fmt.Sprintf("%s: %d awake, %d asleep", plural(total, "model"), states[lifecycle.Awake], states[lifecycle.Sleeping])
	for _, st := range []lifecycle.State{lifecycle.Waking, lifecycle.Draining, lifecycle.Unverified, lifecycle.Failed, lifecycle.Unsupported} {
		if n := states[st]; n > 0 {
			s += fmt.Sprintf(", %d %s", n, st)
		}
	}
	return s + "; " + plural(inFlight, "request") + " in flight"
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
