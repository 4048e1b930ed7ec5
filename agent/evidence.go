package agent

import (
	"fmt"
	"strings"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/sockets"
)

// engineReading is what one measuring round found out about a serving
// engine beside napd's leases.
type engineReading struct {
	metrics enginemetrics.Evidence
	// peers are the clients connected to the engine's port that are not
	// napd; listening says whether a socket listens on that port at all
	// in napd's network namespace. tableErr: the socket table could not
	// be read (then neither is known).
	peers     []sockets.Peer
	listening bool
	tableErr  error
}

// activity is what the evidence the model's `evidence` key chooses says
// about the engine's work, with a detail for reasons: what it is busy
// with, or what is missing when it says nothing.
func activity(mode string, port int, r engineReading) (planner.Engine, string) {
	useMetrics := mode == config.EvidenceMetrics || mode == config.EvidenceAuto && r.metrics.Have()
	switch {
	case mode == config.EvidenceLeases:
		return planner.EngineNone, `evidence = "leases": only napd's own requests are tracked`
	case useMetrics && r.metrics.Idle():
		return planner.EngineIdle, ""
	case useMetrics && r.metrics.Have():
		return planner.EngineBusy, fmt.Sprintf("the engine reports %d requests running and %d waiting", r.metrics.Running, r.metrics.Waiting)
	case useMetrics:
		return planner.EngineNone, "the engine publishes no activity metrics napd reads"
	case r.tableErr != nil:
		return planner.EngineNone, "the socket table cannot be read (" + r.tableErr.Error() + ")"
	case !r.listening:
		return planner.EngineNone, fmt.Sprintf("no socket listens on 127.0.0.1:%d in napd's network namespace, so its clients cannot be seen", port)
	case len(r.peers) > 0:
		return planner.EngineBusy, inUseOutside(r.peers)
	}
	return planner.EngineIdle, ""
}

// inUseOutside says who uses the engine without napd, e.g. "in use outside
// napd: 127.0.0.1:54012 (pid 4711, curl)".
func inUseOutside(peers []sockets.Peer) string {
	const shown = 3
	names := make([]string, 0, shown)
	for i, p := range peers {
		if i == shown {
			names = append(names, fmt.Sprintf("and %d more", len(peers)-shown))
			break
		}
		names = append(names, p.String())
	}
	return "in use outside napd: " + strings.Join(names, ", ")
}
