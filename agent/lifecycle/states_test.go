package lifecycle

import (
	"slices"
	"strings"
	"testing"
)

// States lists every state that has a name, once: metrics, the STATUS=
// line and the balancer's answers iterate it, so a state added later
// without being listed fails here.
func TestStates_Complete(t *testing.T) {
	var named []State
	for s := State(1); !strings.HasPrefix(s.String(), "State("); s++ {
		named = append(named, s)
	}
	got := States()
	if len(got) != len(named) {
		t.Fatalf("States() = %v, want the %d named states %v", got, len(named), named)
	}
	for _, s := range named {
		if !slices.Contains(got, s) {
			t.Errorf("state %s missing from States()", s)
		}
	}
}
