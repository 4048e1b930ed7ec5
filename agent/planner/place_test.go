package planner

import (
	"slices"
	"strings"
	"testing"

	"github.com/napd/napd/agent/lifecycle"
)

func TestPlace(t *testing.T) {
	// Two 80 GiB GPUs; reserve 1 GiB.
	two := func(free0, free1 int64, models ...Model) Input {
		in := roomy(models...)
		in.GPUs = []GPU{{Index: 0, Total: 80 * GiB, Free: free0}, {Index: 1, Total: 80 * GiB, Free: free1}}
		return in
	}
	x := func(b int64, opts ...opt) Model {
		return model("x", append([]opt{state(lifecycle.Sleeping), footprint(b), onGPUs()}, opts...)...)
	}
	tests := []struct {
		name  string
		in    Input
		count int
		last  []int
		gpus  []int
		fits  bool
		msg   string
	}{
		{"freer GPU", two(30*GiB, 60*GiB, x(20*GiB)), 1, nil, []int{1}, true, "the most free memory"},
		{"last set preferred when it fits", two(30*GiB, 60*GiB, x(20*GiB)), 1, []int{0}, []int{0}, true, "the set used last"},
		{"last set left when it does not fit", two(10*GiB, 60*GiB, x(20*GiB)), 1, []int{0}, []int{1}, true, "the most free memory"},
		{"count 2 gets both", two(30*GiB, 60*GiB, x(40*GiB)), 2, nil, []int{0, 1}, true, "share 20.0 GiB"},
		{"fits nowhere: short the least", two(5*GiB, 15*GiB, x(20*GiB)), 1, nil, []int{1}, false, "short the least"},
		{"unknown footprint: freest", two(30*GiB, 60*GiB, x(0)), 1, nil, []int{1}, true, ""},
		{"a loading model's share is taken", two(60*GiB, 60*GiB, x(20*GiB),
			model("w", state(lifecycle.Waking), footprint(50*GiB), onGPUs(1))), 1, nil, []int{0}, true, ""},
		{"own sleeping memory counts", two(25*GiB, 30*GiB, x(30*GiB, holds(map[int]int64{0: 10 * GiB}))), 1, nil, []int{0}, true, ""},
		{"too few GPUs", two(30*GiB, 60*GiB, x(20*GiB)), 3, nil, nil, false, "needs 3 GPUs, 2 report memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Place(tt.in, "x", tt.count, tt.last)
			if !slices.Equal(p.GPUs, tt.gpus) || p.Fits != tt.fits {
				t.Errorf("Place = %v fits %v, want %v fits %v (%s)", p.GPUs, p.Fits, tt.gpus, tt.fits, p.Message)
			}
			if !strings.Contains(p.Message, tt.msg) {
				t.Errorf("message %q lacks %q", p.Message, tt.msg)
			}
		})
	}
}

// A set is one vendor's GPUs, and a MIG instance only serves alone: on a
// box with two NVIDIA GPUs (one split into MIG instances) and two AMD ones,
// { count = 2 } gets the AMD pair though an NVIDIA pair would be freer.
func TestPlace_OneVendorNoMIGPair(t *testing.T) {
	in := roomy(model("x", state(lifecycle.Sleeping), footprint(20*GiB), onGPUs()))
	in.GPUs = []GPU{
		{Index: 0, Total: 40 * GiB, Free: 40 * GiB, Vendor: "nvidia", Alone: true},
		{Index: 1, Total: 80 * GiB, Free: 80 * GiB, Vendor: "nvidia"},
		{Index: 2, Total: 64 * GiB, Free: 30 * GiB, Vendor: "amd"},
		{Index: 3, Total: 64 * GiB, Free: 30 * GiB, Vendor: "amd"},
	}
	if p := Place(in, "x", 2, nil); !slices.Equal(p.GPUs, []int{2, 3}) || !p.Fits {
		t.Errorf("count 2: %+v, want the AMD pair", p)
	}
	if p := Place(in, "x", 1, nil); !slices.Equal(p.GPUs, []int{1}) {
		t.Errorf("count 1: %+v, want the freest GPU", p)
	}
	in.GPUs = in.GPUs[:2]
	if p := Place(in, "x", 2, nil); p.GPUs != nil || !strings.Contains(p.Message, "needs 2 GPUs of one vendor, none of them a MIG instance") {
		t.Errorf("a MIG instance and a GPU: %+v, want no set", p)
	}
}

func TestCombinations(t *testing.T) {
	got := combinations([]int{0, 1, 2}, 2)
	want := [][]int{{0, 1}, {0, 2}, {1, 2}}
	if !slices.EqualFunc(got, want, slices.Equal[[]int]) {
		t.Errorf("combinations = %v, want %v", got, want)
	}
}
