package room

import (
	"slices"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
)

// A hand-advanced clock crosses a weekday window's start once a day: the
// model is named at the first tick at or after 08:00 on each weekday, and
// never on the weekend; InWindow follows the window.
func TestWindowStarts_HandAdvancedClock(t *testing.T) {
	w, err := config.ParseWindow("Mon..Fri 08:00..18:30")
	if err != nil {
		t.Fatal(err)
	}
	models := []*config.Model{{Name: "warm", KeepAwake: []config.Window{w}}, {Name: "plain"}}
	clock := time.Date(2026, 11, 29, 7, 0, 0, 0, time.Local) // a Sunday
	var woken []string
	for range 7 * 24 * 12 { // a week of 5-minute ticks
		prev := clock
		clock = clock.Add(5 * time.Minute)
		for _, name := range windowStarts(models, prev, clock) {
			woken = append(woken, name+" "+clock.Format("Mon 15:04"))
		}
		hm := clock.Hour()*60 + clock.Minute()
		weekday := clock.Weekday() != time.Saturday && clock.Weekday() != time.Sunday
		if got, want := models[0].InWindow(clock), weekday && hm >= 8*60 && hm < 18*60+30; got != want {
			t.Fatalf("inWindow at %s = %v", clock, got)
		}
	}
	want := []string{"warm Mon 08:00", "warm Tue 08:00", "warm Wed 08:00", "warm Thu 08:00", "warm Fri 08:00"}
	if !slices.Equal(woken, want) {
		t.Errorf("woken %v, want %v", woken, want)
	}
}
