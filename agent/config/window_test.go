package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseWindow(t *testing.T) {
	w, err := ParseWindow("Mon..Fri 08:00..18:30")
	if err != nil {
		t.Fatal(err)
	}
	if w.Start != 8*60 || w.End != 18*60+30 || w.Days != [7]bool{false, true, true, true, true, true, false} {
		t.Errorf("got %+v", w)
	}
	if w, _ := ParseWindow("Fri..Mon,Wed 22:00..06:00"); w.Days != [7]bool{true, true, false, true, false, true, true} {
		t.Errorf("wrapping range and list: %v", w.Days)
	}
	if w, _ := ParseWindow("00:00..24:00"); w.Days != [7]bool{true, true, true, true, true, true, true} || w.End != 1440 {
		t.Errorf("every day: %+v", w)
	}
	for _, bad := range []struct{ in, msg string }{
		{"Mon..Fri", "want HH:MM"},
		{"Mon 08:00-09:00", "want a time range"},
		{"Mon +8:00..09:00", "want HH:MM"},
		{"Mon..Fri 8:00..18:30", "want HH:MM"},
		{"Mon..Fri 08:00..25:00", "between 00:00 and 23:59"},
		{"Mon..Fri 24:00..08:00", "between 00:00 and 23:59"},
		{"Mon..Fry 08:00..18:30", `unknown day "Fry"`},
		{"Mon 08:00..08:00", "same time"},
		{"Mon 08:00..09:00 extra", "want \"DAYS HH:MM..HH:MM\""},
		{"", "want \"DAYS HH:MM..HH:MM\""},
	} {
		if _, err := ParseWindow(bad.in); err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("ParseWindow(%q) = %v, want %q", bad.in, err, bad.msg)
		}
	}
}

// A hand-advanced clock walks through a week: the window holds on weekdays
// between 08:00 and 18:30 only, and its start is seen once per day, by the
// first tick at or after it.
func TestWindow_ContainsAndStartedIn(t *testing.T) {
	w, _ := ParseWindow("Mon..Fri 08:00..18:30")
	loc := time.FixedZone("host", 2*3600)
	clock := time.Date(2026, 11, 29, 0, 0, 0, 0, loc) // a Sunday
	starts := 0
	var startedAt []string
	for range 7 * 24 * 4 { // every 15 minutes for a week
		prev := clock
		clock = clock.Add(15 * time.Minute)
		in := w.Contains(clock)
		wd, hm := clock.Weekday(), clock.Hour()*60+clock.Minute()
		want := wd >= time.Monday && wd <= time.Friday && hm >= 8*60 && hm < 18*60+30
		if in != want {
			t.Fatalf("Contains(%s) = %v, want %v", clock, in, want)
		}
		if w.StartedIn(prev, clock) {
			starts++
			startedAt = append(startedAt, clock.Format("Mon 15:04"))
		}
	}
	if starts != 5 || startedAt[0] != "Mon 08:00" || startedAt[4] != "Fri 08:00" {
		t.Errorf("starts seen: %v", startedAt)
	}
	// Over midnight: Friday's 22:00..06:00 holds early on Saturday.
	night, _ := ParseWindow("Fri 22:00..06:00")
	if !night.Contains(time.Date(2026, 12, 5, 5, 59, 0, 0, loc)) || night.Contains(time.Date(2026, 12, 5, 6, 0, 0, 0, loc)) {
		t.Error("the night window does not run to Saturday 06:00")
	}
}

func FuzzParseWindow(f *testing.F) {
	for _, s := range []string{"Mon..Fri 08:00..18:30", "daily 22:00..06:00", "00:00..24:00", "Sat,Sun 10:00..14:00", "Fri..Mon 1:00..2:00", ""} {
		f.Add(s)
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseWindow(s)
		if err != nil {
			return
		}
		// An end of 00:00 is midnight after the start (the range runs over it).
		if w.Start < 0 || w.Start >= 1440 || w.End < 0 || w.End > 1440 || w.Start == w.End {
			t.Fatalf("ParseWindow(%q) = %+v: times out of range", s, w)
		}
		// Contains and StartedIn never panic, and a start implies Contains.
		for h := range 48 {
			now := at.Add(time.Duration(h) * time.Hour)
			if w.StartedIn(now.Add(-time.Hour), now) && !w.Contains(now) {
				t.Fatalf("%q: started at %s but does not contain it", s, now)
			}
		}
	})
}
