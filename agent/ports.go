package agent

import (
	"slices"

	"github.com/napd/napd/probes/sockets"
	"github.com/napd/napd/supervisor"
)

// foreignListeners is the supervisor's PortCheck over the kernel's socket
// table: the listeners on 127.0.0.1:port whose process is not one of the
// engine's. A listener napd cannot trace to a process (another user's,
// napd not root) is foreign too.
func foreignListeners(port int, engine []int) ([]supervisor.PortHolder, error) {
	tab, err := sockets.Reader{}.Read()
	if err != nil {
		return nil, err
	}
	var out []supervisor.PortHolder
	for _, l := range tab.Listeners(port, engine) {
		if l.PID == 0 || !slices.Contains(engine, l.PID) {
			out = append(out, supervisor.PortHolder{PID: l.PID, Name: l.Name, UID: l.UID})
		}
	}
	return out, nil
}
