package config

import (
	"fmt"
	"strings"
	"time"
)

// Window is one keep_awake entry: days of the week and a time of day range
// in the host's time zone, e.g. "Mon..Fri 08:00..18:30". A range whose end
// is not after its start runs over midnight into the next day (it belongs
// to the day it starts on).
type Window struct {
	Days       [7]bool // by time.Weekday
	Start, End int     // minutes after midnight; End may be 1440 (24:00)
	Text       string  // as written
}

var weekdays = []string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}

// ParseWindow parses "DAYS HH:MM..HH:MM", where DAYS is a comma-separated
// list of days ("Mon") and day ranges ("Mon..Fri", "Fri..Mon" wraps), or
// "daily"; DAYS may be left out for every day.
func ParseWindow(s string) (Window, error) {
	w := Window{Text: s}
	fields := strings.Fields(s)
	var days, times string
	switch len(fields) {
	case 1:
		days, times = "daily", fields[0]
	case 2:
		days, times = fields[0], fields[1]
	default:
		return w, fmt.Errorf("window %q: want \"DAYS HH:MM..HH:MM\", e.g. \"Mon..Fri 08:00..18:30\"", s)
	}
	if days == "daily" {
		for i := range w.Days {
			w.Days[i] = true
		}
	} else {
		for part := range strings.SplitSeq(days, ",") {
			from, to, isRange := strings.Cut(part, "..")
			a, err := weekday(from)
			if err != nil {
				return w, fmt.Errorf("window %q: %w", s, err)
			}
			b := a
			if isRange {
				if b, err = weekday(to); err != nil {
					return w, fmt.Errorf("window %q: %w", s, err)
				}
			}
			for d := a; ; d = (d + 1) % 7 {
				w.Days[d] = true
				if d == b {
					break
				}
			}
		}
	}
	from, to, ok := strings.Cut(times, "..")
	if !ok {
		return w, fmt.Errorf("window %q: want a time range HH:MM..HH:MM, got %q", s, times)
	}
	var err error
	if w.Start, err = clock(from, false); err != nil {
		return w, fmt.Errorf("window %q: %w", s, err)
	}
	if w.End, err = clock(to, true); err != nil {
		return w, fmt.Errorf("window %q: %w", s, err)
	}
	if w.Start == w.End {
		return w, fmt.Errorf("window %q: starts and ends at the same time", s)
	}
	return w, nil
}

func weekday(s string) (int, error) {
	for i, d := range weekdays {
		if strings.EqualFold(s, d) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("unknown day %q: want Mon, Tue, Wed, Thu, Fri, Sat or Sun", s)
}

// clock parses HH:MM; 24:00 only as an end.
func clock(s string, end bool) (int, error) {
	digit := func(i int) int { return int(s[i] - '0') }
	if len(s) != 5 || s[2] != ':' || strings.ContainsFunc(s[:2]+s[3:], func(r rune) bool { return r < '0' || r > '9' }) {
		return 0, fmt.Errorf("time %q: want HH:MM", s)
	}
	h, m := digit(0)*10+digit(1), digit(3)*10+digit(4)
	if m > 59 || h > 24 || (h == 24 && (m != 0 || !end)) {
		return 0, fmt.Errorf("time %q: want HH:MM between 00:00 and 23:59 (24:00 as an end)", s)
	}
	return h*60 + m, nil
}

// InWindow reports whether one of the model's keep_awake windows holds at
// now (in the host's time zone).
func (m *Model) InWindow(now time.Time) bool {
	for _, w := range m.KeepAwake {
		if w.Contains(now.Local()) {
			return true
		}
	}
	return false
}

// Contains reports whether t (in the location it carries: the host's for
// napd) falls within the window.
func (w Window) Contains(t time.Time) bool {
	_, ok := w.startOf(t)
	return ok
}

// startOf is the start of the window occurrence that contains t.
func (w Window) startOf(t time.Time) (time.Time, bool) {
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, t.Location())
	// The occurrence starting today, or one that started yesterday and
	// runs over midnight.
	for _, d := range []time.Time{day, time.Date(t.Year(), t.Month(), t.Day()-1, 0, 0, 0, 0, t.Location())} {
		if !w.Days[d.Weekday()] {
			continue
		}
		// time.Date, not Add: a day with a DST change is not 24 hours.
		start := time.Date(d.Year(), d.Month(), d.Day(), 0, w.Start, 0, 0, d.Location())
		endDay := d.Day()
		if w.End <= w.Start {
			endDay++
		}
		end := time.Date(d.Year(), d.Month(), endDay, 0, w.End, 0, 0, d.Location())
		if !t.Before(start) && t.Before(end) {
			return start, true
		}
	}
	return time.Time{}, false
}

// StartedIn reports whether an occurrence of the window started in
// (after, now] and still runs at now: a model kept awake by it is woken.
func (w Window) StartedIn(after, now time.Time) bool {
	start, ok := w.startOf(now)
	return ok && start.After(after)
}
