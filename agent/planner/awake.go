package planner

import (
	"fmt"
	"strings"

	"github.com/napd/napd/agent/lifecycle"
)

// ReasonMaxAwake: an idle model put to sleep so that a wake stays within
// policy.max_awake.
const ReasonMaxAwake Reason = "max-awake"

// MaxAwake is PlanMaxAwake's answer for one wake.
type MaxAwake struct {
	// Sleeps are the idle models to put to sleep, least recently used
	// first; empty when the wake is within the limit.
	Sleeps []Decision
	// Wait: the limit is reached and not enough models are idle; the wake
	// waits for one to become idle (Message says which are busy).
	Wait    bool
	Message string
}

// PlanMaxAwake keeps at most max models awake when the named model wakes:
// the awake and waking models other than it count (draining ones are on
// their way to sleep); when they reach max, the least recently used
// proven-idle, unpinned ones are put to sleep (demand overrides the idle
// minimum), as many as needed. max 0 = unlimited.
func PlanMaxAwake(in Input, waking string, max int) MaxAwake {
	if max <= 0 {
		return MaxAwake{}
	}
	p := newPlanner(&in)
	var awake, idle []*Model
	for _, m := range p.byLRU {
		if m.Name == waking || (m.State != lifecycle.Awake && m.State != lifecycle.Waking) {
			continue
		}
		awake = append(awake, m)
		if m.demandIdle() {
			idle = append(idle, m)
		}
	}
	over := len(awake) - max + 1
	if over <= 0 {
		return MaxAwake{}
	}
	why := fmt.Sprintf("max_awake %d: %d awake, %s wakes", max, len(awake), waking)
	for _, m := range idle[:min(over, len(idle))] {
		p.decide(m, ReasonMaxAwake, why+", least recently used idle model")
	}
	res := MaxAwake{Sleeps: p.decisions, Message: why}
	if over > len(idle) {
		var busy []string
		for _, m := range awake {
			if !p.chosen[m.Name] {
				busy = append(busy, m.Name)
			}
		}
		res.Wait = true
		res.Message = fmt.Sprintf("%s; waiting for one of %s to be idle", why, strings.Join(busy, ", "))
	}
	return res
}
