package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/napd/napd/agent/lifecycle"
)

// notifier speaks sd_notify to systemd. Outside systemd (no NOTIFY_SOCKET)
// every call is a no-op: not being supervised is not an error.
type notifier struct {
	log *slog.Logger
}

func (n notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify failed", "state", state, "err", err)
	}
}

func (n notifier) ready()             { n.send(daemon.SdNotifyReady) }
func (n notifier) stopping()          { n.send(daemon.SdNotifyStopping) }
func (n notifier) status(line string) { n.send("STATUS=" + line) }

// reloading tells systemd a reload began; MONOTONIC_USEC lets systemd match
// the READY=1 that ends it (Type=notify-reload semantics, harmless for notify).
func (n notifier) reloading() {
	n.send(daemon.SdNotifyReloading + "\n" + daemon.SdNotifyMonotonicUsec())
}

// watchdog pings systemd at half the configured interval until ctx ends.
// healthy is asked before each ping so a wedged agent stops pinging and
// systemd restarts it.
func (n notifier) watchdog(ctx context.Context, healthy func() error) {
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

// statusLine is the STATUS= text systemctl status shows.
func statusLine(states map[lifecycle.State]int, total, inFlight int) string {
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
