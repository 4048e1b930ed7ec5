package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/napd/napd/agent/control"
)

// WaitLeases waits until model holds at least want leases in napd's
// status, that is until napd has accepted that many of its requests. Tests
// wait on this rather than sleep before they act on requests "in flight".
func (n *Napd) WaitLeases(model string, want int, within time.Duration) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	client := control.NewClient(n.Socket)
	last := "no status"
	for {
		st, err := client.Status(ctx)
		if err == nil {
			last = fmt.Sprintf("model %s not in status", model)
			for _, m := range st.Models {
				if m.Name == model {
					if m.Leases >= want {
						return
					}
					last = fmt.Sprintf("%d leases", m.Leases)
				}
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			n.t.Fatalf("model %s: not %d leases within %s; last: %s", model, want, within, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
