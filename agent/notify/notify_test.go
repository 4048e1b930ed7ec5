package notify

import (
	"testing"

	"github.com/napd/napd/agent/lifecycle"
)

// The STATUS= line systemctl status shows: awake and asleep always, the
// other states only when some model is in them, in a fixed order.
func TestStatusLine(t *testing.T) {
	for _, c := range []struct {
		states          map[lifecycle.State]int
		total, inFlight int
		want            string
	}{
		{nil, 0, 0, "0 models: 0 awake, 0 asleep; 0 requests in flight"},
		{map[lifecycle.State]int{lifecycle.Awake: 1, lifecycle.Sleeping: 2}, 3, 4, "3 models: 1 awake, 2 asleep; 4 requests in flight"},
		{map[lifecycle.State]int{lifecycle.Awake: 1}, 1, 1, "1 model: 1 awake, 0 asleep; 1 request in flight"},
		{map[lifecycle.State]int{lifecycle.Failed: 1, lifecycle.Waking: 1, lifecycle.Unsupported: 1, lifecycle.Draining: 1, lifecycle.Unverified: 1, lifecycle.Awake: 0}, 5, 1,
			"5 models: 0 awake, 0 asleep, 1 waking, 1 draining, 1 unverified, 1 failed, 1 unsupported; 1 request in flight"},
	} {
		if got := Line(c.states, c.total, c.inFlight); got != c.want {
			t.Errorf("Line(%v, %d, %d) = %q, want %q", c.states, c.total, c.inFlight, got, c.want)
		}
	}
}
