package measure

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/planner"
	"github.com/napd/napd/probes/enginemetrics"
	"github.com/napd/napd/probes/sockets"
)

func TestActivity(t *testing.T) {
	curl := sockets.Peer{Addr: netip.MustParseAddrPort("127.0.0.1:54012"), Process: sockets.Process{PID: 4711, Name: "curl"}}
	remote := sockets.Peer{Addr: netip.MustParseAddrPort("10.0.0.7:41000")}
	idleVLLM := enginemetrics.Evidence{Engine: "vllm", Counts: true}
	busyVLLM := enginemetrics.Evidence{Engine: "vllm", Counts: true, Running: 2}
	ollama := enginemetrics.Evidence{Engine: "ollama", Held: []enginemetrics.Held{}}
	tests := []struct {
		name   string
		mode   config.Evidence
		r      engineReading
		want   planner.Engine
		detail string
	}{
		{"auto: metrics idle, despite a keep-alive client", config.EvidenceAuto, engineReading{metrics: idleVLLM, listening: true, peers: []sockets.Peer{curl}}, planner.EngineIdle, ""},
		{"auto: metrics busy", config.EvidenceAuto, engineReading{metrics: busyVLLM, listening: true}, planner.EngineBusy, "2 requests running and 0 waiting"},
		{"auto: no metrics, nobody outside", config.EvidenceAuto, engineReading{listening: true}, planner.EngineIdle, ""},
		{"auto: Ollama has no counts: connections", config.EvidenceAuto, engineReading{metrics: ollama, listening: true, peers: []sockets.Peer{curl}}, planner.EngineBusy, "in use outside napd: 127.0.0.1:54012 (pid 4711, curl)"},
		{"auto: a client on another host", config.EvidenceAuto, engineReading{listening: true, peers: []sockets.Peer{remote}}, planner.EngineBusy, "in use outside napd: 10.0.0.7:41000"},
		{"auto: engine in another namespace", config.EvidenceAuto, engineReading{}, planner.EngineNone, "no socket listens on 127.0.0.1:8001"},
		{"auto: table unreadable", config.EvidenceAuto, engineReading{tableErr: errors.New("permission denied")}, planner.EngineNone, "socket table cannot be read (permission denied)"},
		{"connections: ignores the metrics", config.EvidenceConnections, engineReading{metrics: busyVLLM, listening: true}, planner.EngineIdle, ""},
		{"metrics: none published", config.EvidenceMetrics, engineReading{listening: true}, planner.EngineNone, "publishes no activity metrics"},
		{"leases: nothing else counts", config.EvidenceLeases, engineReading{metrics: idleVLLM, listening: true}, planner.EngineNone, `evidence = "leases"`},
	}
	for _, tt := range tests {
		got, detail := activity(tt.mode, 8001, tt.r)
		if got != tt.want || !strings.Contains(detail, tt.detail) || (tt.detail == "" && detail != "") {
			t.Errorf("%s: %v %q, want %v %q", tt.name, got, detail, tt.want, tt.detail)
		}
	}
	many := []sockets.Peer{curl, remote, curl, remote, curl}
	if got := inUseOutside(many); !strings.HasSuffix(got, ", and 2 more") {
		t.Errorf("five clients: %q", got)
	}
}

func TestNotes(t *testing.T) {
	curl := sockets.Peer{Addr: netip.MustParseAddrPort("127.0.0.1:54012"), Process: sockets.Process{PID: 4711, Name: "curl"}}
	held := enginemetrics.Evidence{Engine: enginemetrics.EngineOllama, Held: []enginemetrics.Held{
		{Name: "qwen2.5:0.5b", ExpiresAt: time.Date(2026, 12, 1, 3, 40, 0, 0, time.UTC)}}}
	for _, tt := range []struct {
		r    engineReading
		want string
	}{
		{engineReading{}, ""},
		{engineReading{peers: []sockets.Peer{curl}}, "in use outside napd: 127.0.0.1:54012 (pid 4711, curl)"},
		{engineReading{metrics: held, peers: []sockets.Peer{curl}}, "in use outside napd: 127.0.0.1:54012 (pid 4711, curl); Ollama holds qwen2.5:0.5b until 2026-12-01T03:40:00Z"},
		{engineReading{metrics: enginemetrics.Evidence{Engine: enginemetrics.EngineOllama, Held: []enginemetrics.Held{}}}, "Ollama holds nothing"},
	} {
		if got := notes(tt.r); got != tt.want {
			t.Errorf("notes = %q, want %q", got, tt.want)
		}
	}
}

// When an engine was last seen at work: busy, or its counters moved since
// the round before (work between two rounds that no reading caught
// running); unchanged counters keep the time last seen; a round that began
// earlier but ended later does not take it back; a model that stopped
// serving starts afresh.
func TestLastActivity(t *testing.T) {
	var l lastActivity
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	counters := func(n float64) enginemetrics.Evidence {
		return enginemetrics.Evidence{Engine: "llamacpp", Counts: true, Progress: n, HaveProgress: true}
	}
	steps := []struct {
		at   int
		busy bool
		ev   enginemetrics.Evidence
		want int // -1: zero time
	}{
		{0, false, counters(10), -1}, // first reading: nothing to compare with
		{2, false, counters(10), -1}, // unchanged
		{4, false, counters(14), 4},  // moved since the round before
		{6, false, counters(14), 4},  // unchanged: still last seen at 4
		{8, true, enginemetrics.Evidence{}, 8},
		{7, true, counters(14), 8}, // an older round that ended late
		{10, false, counters(14), 8},
	}
	for i, s := range steps {
		got := l.seen("m", at(s.at), s.busy, s.ev)
		want := time.Time{}
		if s.want >= 0 {
			want = at(s.want)
		}
		if !got.Equal(want) {
			t.Errorf("step %d (round at %ds): last seen at work %v, want %v", i, s.at, got, want)
		}
	}
	l.forget("m")
	if got := l.seen("m", at(12), false, counters(99)); !got.IsZero() {
		t.Errorf("after forget: %v, want zero (a new engine's counters are not a move)", got)
	}
}
