// Package warmweights keeps the weight files of models whose engine is
// stopped in the host's page cache while host memory allows, so that
// their next wake reads them from RAM instead of the disk. Decide is the
// pure decision; the Keeper performs it on a goroutine of its own, at idle
// I/O priority, never in the way of a wake or a request.
package warmweights

import (
	"fmt"
	"slices"
	"time"
)

// Candidate is one stopped model with weight files, as the caller saw it.
type Candidate struct {
	Model string
	// Bytes is the size of its weight files, Resident how much of them
	// is in the page cache now.
	Bytes, Resident int64
	// Warmed: napd warmed them (and may drop them again); pages the
	// kernel cached on its own are not napd's to drop.
	Warmed bool
	// What makes its next wake likely: a keep_awake window holding now,
	// warm_on_start, and its last use.
	InWindow, WarmOnStart bool
	LastUsed              time.Time
}

// Host is the host memory evidence of one round.
type Host struct {
	MemAvailable int64
	HaveMem      bool
	// Pressed: memory PSI above the [pressure] threshold.
	Pressed bool
	// Reserve is [pressure] host_reserve: warming never eats into it.
	Reserve int64
}

// Decision is what to do this round.
type Decision struct {
	// Warm are the models to warm (or re-warm what the kernel evicted),
	// most likely first.
	Warm []string
	// Drop are the models whose warmed weights to drop from the page
	// cache, least likely first.
	Drop []string
	// Budget is the bytes that may be kept warm this round; Why says how
	// it was reached (for logs).
	Budget int64
	Why    string
}

// Decide chooses which stopped models' weights to keep warm within the
// budget ([policy] warm_weights: config.WarmWeightsAuto, 0 for off, or a
// size), given the host now.
//
// Auto is what MemAvailable holds above host_reserve; a size is that,
// capped at the size. Clean page cache counts in MemAvailable, so what
// napd keeps warm is reclaimable by the kernel at any time; napd still
// drops it itself before engines would compete with it: under memory
// pressure (MemAvailable below host_reserve, or PSI above its threshold)
// nothing is warmed, and warmed weights are dropped least likely first:
// as many as cover the shortfall, or one a round under PSI alone (its
// relief cannot be projected). Otherwise the most likely next wakes
// (a keep_awake window now, warm_on_start, then the most recently used)
// are kept warm while they fit; the warmed ones that no longer fit are
// dropped. Without a memory reading nothing is warmed or dropped.
func Decide(cands []Candidate, budget int64, h Host) Decision {
	order := slices.Clone(cands)
	slices.SortStableFunc(order, func(a, b Candidate) int { return likelier(b, a) - likelier(a, b) })
	switch {
	case budget == 0:
		return Decision{Drop: drops(order, true, 0), Why: "warm_weights is off"}
	case !h.HaveMem:
		return Decision{Why: "no host memory reading"}
	}
	if short := h.Reserve - h.MemAvailable; short > 0 || h.Pressed {
		why := fmt.Sprintf("MemAvailable %s is below host_reserve %s", gib(h.MemAvailable), gib(h.Reserve))
		if short <= 0 {
			why = "memory PSI is above psi_some_avg10"
		}
		return Decision{Drop: drops(order, false, short), Why: why}
	}
	room := h.MemAvailable - h.Reserve
	why := fmt.Sprintf("MemAvailable %s less host_reserve %s", gib(h.MemAvailable), gib(h.Reserve))
	if budget > 0 && budget < room {
		room, why = budget, fmt.Sprintf("warm_weights %s", gib(budget))
	}
	d := Decision{Budget: room, Why: why}
	var kept int64
	var over []string
	for _, c := range order {
		if c.Bytes == 0 {
			continue
		}
		if kept+c.Bytes > room {
			if c.Warmed && c.Resident > 0 {
				over = append(over, c.Model)
			}
			continue
		}
		kept += c.Bytes
		if c.Resident < c.Bytes {
			d.Warm = append(d.Warm, c.Model)
		}
	}
	slices.Reverse(over)
	d.Drop = over
	return d
}

// likelier reports (as 1 or 0) whether a's next wake is likelier than b's.
func likelier(a, b Candidate) int {
	switch {
	case a.InWindow != b.InWindow:
		return boolInt(a.InWindow)
	case a.WarmOnStart != b.WarmOnStart:
		return boolInt(a.WarmOnStart)
	default:
		return boolInt(a.LastUsed.After(b.LastUsed))
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// drops are the warmed models with resident weights to drop, least
// likely first: all of them, or as many as cover short (at least one).
func drops(order []Candidate, all bool, short int64) []string {
	var out []string
	for _, c := range slices.Backward(order) {
		if !c.Warmed || c.Resident == 0 {
			continue
		}
		out = append(out, c.Model)
		short -= c.Resident
		if !all && short <= 0 {
			break
		}
	}
	return out
}

// gib is a size for logs and notes: GiB, or MiB below one.
func gib(b int64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}
