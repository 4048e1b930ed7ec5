package warmweights

import (
	"slices"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
)

const gb = 1 << 30

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// three stopped models of 10 GiB: c used last, b before, a first.
func three() []Candidate {
	return []Candidate{
		{Model: "a", Bytes: 10 * gb, LastUsed: t0},
		{Model: "b", Bytes: 10 * gb, LastUsed: t0.Add(time.Minute)},
		{Model: "c", Bytes: 10 * gb, LastUsed: t0.Add(2 * time.Minute)},
	}
}

func roomy(avail int64) Host { return Host{MemAvailable: avail, HaveMem: true, Reserve: 2 * gb} }

func check(t *testing.T, d Decision, warm, drop []string) {
	t.Helper()
	if !slices.Equal(d.Warm, warm) || !slices.Equal(d.Drop, drop) {
		t.Fatalf("warm %q drop %q, want warm %q drop %q (%s)", d.Warm, d.Drop, warm, drop, d.Why)
	}
}

func TestDecide_AutoWarmsMostRecentWhileTheyFit(t *testing.T) {
	// 25 GiB above the reserve: two of the three, the most recent ones.
	d := Decide(three(), config.WarmWeightsAuto, roomy(27*gb))
	check(t, d, []string{"c", "b"}, nil)
	if d.Budget != 25*gb {
		t.Fatalf("budget %d, want 25 GiB", d.Budget)
	}
}

func TestDecide_WindowAndWarmOnStartComeFirst(t *testing.T) {
	c := three()
	c[0].InWindow = true    // a: its keep_awake window holds now
	c[1].WarmOnStart = true // b
	check(t, Decide(c, config.WarmWeightsAuto, roomy(100*gb)), []string{"a", "b", "c"}, nil)
	check(t, Decide(c, config.WarmWeightsAuto, roomy(13*gb)), []string{"a"}, nil)
}

func TestDecide_SizeCapsAndSkipsWhatDoesNotFit(t *testing.T) {
	c := three()
	c[2].Bytes = 20 * gb // c, the most recent, does not fit 15 GiB
	check(t, Decide(c, 15*gb, roomy(100*gb)), []string{"b"}, nil)
}

func TestDecide_ResidentIsNotWarmedAgainButEvictedIs(t *testing.T) {
	c := three()
	c[2].Resident, c[2].Warmed = 10*gb, true
	c[1].Resident, c[1].Warmed = 4*gb, true // partly evicted
	check(t, Decide(c, config.WarmWeightsAuto, roomy(100*gb)), []string{"b", "a"}, nil)
}

func TestDecide_WarmedThatNoLongerFitIsDropped(t *testing.T) {
	c := three()
	for i := range c {
		c[i].Resident, c[i].Warmed = 10*gb, true
	}
	check(t, Decide(c, config.WarmWeightsAuto, roomy(14*gb)), nil, []string{"a", "b"})
	// Pages napd did not warm are the kernel's: not dropped.
	c[0].Warmed = false
	check(t, Decide(c, config.WarmWeightsAuto, roomy(14*gb)), nil, []string{"b"})
}

func TestDecide_HostShortfallDropsLeastLikelyFirst(t *testing.T) {
	c := three()
	for i := range c {
		c[i].Resident, c[i].Warmed = 8*gb, true
	}
	// 1 GiB available, 2 GiB reserve: 1 GiB short, a alone covers it.
	check(t, Decide(c, config.WarmWeightsAuto, roomy(gb)), nil, []string{"a"})
	// 9 GiB short: a and b.
	h := roomy(gb)
	h.Reserve = 10 * gb
	check(t, Decide(c, config.WarmWeightsAuto, h), nil, []string{"a", "b"})
}

func TestDecide_PSIDropsOneARoundAndWarmsNothing(t *testing.T) {
	c := three()
	c[1].Resident, c[1].Warmed = 10*gb, true
	c[2].Resident, c[2].Warmed = 10*gb, true
	h := roomy(100 * gb)
	h.Pressed = true
	check(t, Decide(c, config.WarmWeightsAuto, h), nil, []string{"b"})
}

func TestDecide_OffDropsAllNapdWarmed(t *testing.T) {
	c := three()
	c[0].Resident, c[0].Warmed = gb, true
	c[2].Resident, c[2].Warmed = gb, true
	c[1].Resident = gb
	check(t, Decide(c, 0, roomy(100*gb)), nil, []string{"a", "c"})
}

func TestDecide_NoMemoryReadingDoesNothing(t *testing.T) {
	c := three()
	c[0].Resident, c[0].Warmed = gb, true
	check(t, Decide(c, config.WarmWeightsAuto, Host{}), nil, nil)
}
