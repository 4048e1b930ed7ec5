package model

import "testing"

func TestProgress_MovedSince(t *testing.T) {
	counters := func(n float64) Progress { return Progress{Counters: n, HaveCounters: true} }
	for _, tt := range []struct {
		name         string
		prev, after  Progress
		moved, known bool
	}{
		{"nothing known", Progress{}, Progress{}, false, false},
		{"tokens counted", counters(100), counters(140), true, true},
		{"counters still", counters(100), counters(100), false, true},
		{"counters reset by a restart", counters(100), counters(3), true, true},
		{"counters appear: no comparison", Progress{}, counters(100), false, false},
		{"bytes sent without counters", sent(10), sent(20), true, true},
		{"bytes still", sent(20), sent(20), false, true},
		{"counters still, bytes sent", Progress{Counters: 5, HaveCounters: true, Sent: sent(10).Sent}, Progress{Counters: 5, HaveCounters: true, Sent: sent(30).Sent}, true, true},
	} {
		if moved, known := tt.after.MovedSince(tt.prev); moved != tt.moved || known != tt.known {
			t.Errorf("%s: MovedSince = %v, %v; want %v, %v", tt.name, moved, known, tt.moved, tt.known)
		}
	}
}
