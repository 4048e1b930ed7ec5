package model

import "testing"

func TestProgress_MovedSince(t *testing.T) {
	counters := func(n float64) Progress { return Progress{Counters: n, HaveCounters: true} }
	for _, tt := range []struct {
		name        string
		prev, after Progress
		want        bool
	}{
		{"nothing known", Progress{}, Progress{}, false},
		{"tokens counted", counters(100), counters(140), true},
		{"counters still", counters(100), counters(100), false},
		{"counters reset by a restart", counters(100), counters(3), true},
		{"counters appear: no comparison", Progress{}, counters(100), false},
		{"bytes sent without counters", sent(10), sent(20), true},
		{"counters still, bytes sent", Progress{Counters: 5, HaveCounters: true, Sent: sent(10).Sent}, Progress{Counters: 5, HaveCounters: true, Sent: sent(30).Sent}, true},
	} {
		if got := tt.after.MovedSince(tt.prev); got != tt.want {
			t.Errorf("%s: MovedSince = %v, want %v", tt.name, got, tt.want)
		}
	}
}
