package usage

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/napd/napd/internal/statefile"
)

// Bounds of what a Ledger keeps.
const (
	// KeepHours is how far back the hourly figures go (napctl usage
	// --since at most this).
	KeepHours = 7 * 24
	// maxHourRows bounds the hourly figures (key, model and hour); the
	// oldest hours go first.
	maxHourRows = 50000
	// maxPairs bounds the keys and models accounted apart; the use of
	// pairs beyond it is accounted to OtherKeys.
	maxPairs = 10000
	// maxFile bounds usage.json when it is read.
	maxFile = 32 << 20
)

// OtherKeys is the key the use of pairs beyond maxPairs is accounted to.
const OtherKeys = "(other keys)"

// Use is what a key's requests used of a model.
type Use struct {
	ByteSeconds      float64 `json:"byte_seconds,omitempty"` // GPU memory held on its behalf, integrated
	GPUSeconds       float64 `json:"gpu_seconds,omitempty"`  // the same as whole GPUs
	Wakes            int64   `json:"wakes,omitempty"`        // wakes its requests started
	Swaps            int64   `json:"swaps,omitempty"`        // of those, wakes that waited for others' memory
	PromptTokens     int64   `json:"prompt_tokens,omitempty"`
	CompletionTokens int64   `json:"completion_tokens,omitempty"`
}

// valid: no figure is negative.
func (u Use) valid() bool {
	return u.ByteSeconds >= 0 && u.GPUSeconds >= 0 && u.Wakes >= 0 && u.Swaps >= 0 && u.PromptTokens >= 0 && u.CompletionTokens >= 0
}

func (u *Use) add(v Use) {
	u.ByteSeconds += v.ByteSeconds
	u.GPUSeconds += v.GPUSeconds
	u.Wakes += v.Wakes
	u.Swaps += v.Swaps
	u.PromptTokens += v.PromptTokens
	u.CompletionTokens += v.CompletionTokens
}

// Row is one key's use of one model.
type Row struct {
	Key   string `json:"key"`
	Model string `json:"model"`
	Use
}

type pair struct{ key, model string }

// day is a key's use today, for its quotas.
type day struct {
	GPUSeconds float64 `json:"gpu_seconds,omitempty"`
	Tokens     int64   `json:"tokens,omitempty"`
}

// Ledger is napd's account of who used the box. It is safe for
// concurrent use; every method is one critical section.
type Ledger struct {
	path string
	loc  *time.Location // whose days the quotas count
	// saving serialises Save: a later state is never overwritten by an
	// earlier one.
	saving sync.Mutex

	mu     sync.Mutex
	meters map[string]*meter // by model
	total  map[pair]*Use
	hours  map[int64]map[pair]*Use // by the hour's start, Unix seconds
	date   string                  // today, in loc
	dayEnd time.Time               // when it ends; zero: not worked out yet
	dayAt  time.Time               // when it began
	today  map[string]*day         // by key
	at     time.Time               // the time of the charges being made
	dirty  bool
}

// file is usage.json.
type file struct {
	Version int       `json:"version"`
	Total   []Row     `json:"total"`
	Hours   []hourRow `json:"hours"`
	Date    string    `json:"date"`
	Today   []dayRow  `json:"today"`
}

type hourRow struct {
	Hour int64 `json:"hour"` // its start, Unix seconds
	Row
}

type dayRow struct {
	Key string `json:"key"`
	day
}

// New is an empty ledger that saves to path ("" = never saved) and counts
// quota days in loc (nil: time.Local).
func New(path string, loc *time.Location) *Ledger {
	if loc == nil {
		loc = time.Local
	}
	return &Ledger{path: path, loc: loc, meters: map[string]*meter{}, total: map[pair]*Use{},
		hours: map[int64]map[pair]*Use{}, today: map[string]*day{}}
}

// Open is New with what path holds. A file that cannot be read as a
// ledger is moved aside to path.corrupt, and the error says so: the
// ledger starts empty rather than napd not at all.
func Open(path string, loc *time.Location) (*Ledger, error) {
	l := New(path, loc)
	data, err := statefile.Read(path, maxFile)
	if errors.Is(err, fs.ErrNotExist) {
		return l, nil
	}
	if err == nil {
		err = l.load(data)
	}
	if err != nil {
		aside := path + ".corrupt"
		if rerr := os.Rename(path, aside); rerr != nil {
			return l, fmt.Errorf("%s: %w (and it could not be moved aside: %v)", path, err, rerr)
		}
		return l, fmt.Errorf("%s: %w; moved to %s, usage counts from zero", path, err, aside)
	}
	return l, nil
}

func (l *Ledger) load(data []byte) error {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return err
	}
	if f.Version != 1 {
		return fmt.Errorf("version %d, want 1", f.Version)
	}
	for _, r := range f.Total {
		if !r.valid() {
			return fmt.Errorf("total of %q on %q: a negative figure", r.Key, r.Model)
		}
	}
	for _, r := range f.Hours {
		if !r.valid() || r.Hour%3600 != 0 {
			return fmt.Errorf("hour %d of %q on %q: not the start of an hour, or a negative figure", r.Hour, r.Key, r.Model)
		}
	}
	for _, r := range f.Today {
		if r.GPUSeconds < 0 || r.Tokens < 0 {
			return fmt.Errorf("today of %q: a negative figure", r.Key)
		}
	}
	for _, r := range f.Total {
		l.pairUse(l.total, pair{r.Key, r.Model}).add(r.Use)
	}
	for _, r := range f.Hours {
		l.pairUse(l.hour(r.Hour), pair{r.Key, r.Model}).add(r.Use)
	}
	l.date = f.Date
	for _, r := range f.Today {
		d := r.day
		l.today[r.Key] = &d
	}
	return nil
}

// pairUse is the Use of p in m, made when absent; beyond maxPairs, that
// of p's model under OtherKeys.
func (l *Ledger) pairUse(m map[pair]*Use, p pair) *Use {
	if u := m[p]; u != nil {
		return u
	}
	if len(m) >= maxPairs {
		p.key = OtherKeys
		if u := m[p]; u != nil {
			return u
		}
	}
	u := &Use{}
	m[p] = u
	return u
}

func (l *Ledger) hour(h int64) map[pair]*Use {
	m := l.hours[h]
	if m == nil {
		m = map[pair]*Use{}
		l.hours[h] = m
	}
	return m
}

// record adds u to the key's use of model at l.at: in total, in its hour,
// and to the key's day.
func (l *Ledger) record(model, key string, u Use) {
	p := pair{key, model}
	l.pairUse(l.total, p).add(u)
	l.pairUse(l.hour(l.at.Unix()/3600*3600), p).add(u)
	d := l.day(key)
	d.GPUSeconds += u.GPUSeconds
	d.Tokens += u.PromptTokens + u.CompletionTokens
	l.dirty = true
}

// day is key's use today (at l.at), the day's figures reset at its start.
func (l *Ledger) day(key string) *day {
	if l.at.Before(l.dayAt) || !l.at.Before(l.dayEnd) {
		y, m, d := l.at.In(l.loc).Date()
		l.dayAt, l.dayEnd = time.Date(y, m, d, 0, 0, 0, 0, l.loc), time.Date(y, m, d+1, 0, 0, 0, 0, l.loc)
		if date := l.dayAt.Format(time.DateOnly); date != l.date {
			l.date = date
			clear(l.today)
		}
	}
	d := l.today[key]
	if d == nil {
		if len(l.today) >= maxPairs {
			key = OtherKeys
		}
		if d = l.today[key]; d == nil {
			d = &day{}
			l.today[key] = d
		}
	}
	return d
}

// charge is the meters' sink, under l.mu.
func (l *Ledger) charge(model, key string, byteSeconds, gpuSeconds float64) {
	l.record(model, key, Use{ByteSeconds: byteSeconds, GPUSeconds: gpuSeconds})
}

func (l *Ledger) meter(model string) *meter {
	m := l.meters[model]
	if m == nil {
		m = &meter{}
		l.meters[model] = m
	}
	return m
}

// setAt sets the time of the charges about to be made, never back.
func (l *Ledger) setAt(now time.Time) {
	if now.After(l.at) {
		l.at = now
	}
}

// Begin is a request of key granted a slot of model at now: from now it
// holds a share of the model's footprint.
func (l *Ledger) Begin(now time.Time, model, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	l.meter(model).begin(now, model, key, l)
}

// End is that request's end.
func (l *Ledger) End(now time.Time, model, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	l.meter(model).end(now, model, key, l)
}

// Woke is a wake of model that a request of key started.
func (l *Ledger) Woke(now time.Time, model, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	l.record(model, key, Use{Wakes: 1})
}

// Swapped is a wake of model, started by a request of key, that had to
// wait for other models to give GPU memory back.
func (l *Ledger) Swapped(now time.Time, model, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	l.record(model, key, Use{Swaps: 1})
}

// Tokens is a request of key to model that ended at now with the engine's
// token counts.
func (l *Ledger) Tokens(now time.Time, model, key string, prompt, completion int64) {
	if prompt <= 0 && completion <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	l.record(model, key, Use{PromptTokens: max(prompt, 0), CompletionTokens: max(completion, 0)})
}

// Resize sets model's footprint from now: bytes (as measured), and gpus,
// the same as whole GPUs (GPUShare).
func (l *Ledger) Resize(now time.Time, model string, bytes int64, gpus float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	l.meter(model).resize(now, model, bytes, gpus, l)
}

// Tick charges every model's requests in flight up to now (napd's ticker
// calls it, so a long request is charged to the hour it ran in), and
// drops the hours older than KeepHours and, beyond maxHourRows, the
// oldest.
func (l *Ledger) Tick(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	for _, name := range slices.Sorted(maps.Keys(l.meters)) {
		l.meters[name].advance(now, name, l)
	}
	oldest := now.Unix()/3600*3600 - (KeepHours-1)*3600
	rows := 0
	for _, h := range slices.Backward(slices.Sorted(maps.Keys(l.hours))) {
		if h < oldest || rows+len(l.hours[h]) > maxHourRows {
			delete(l.hours, h)
			l.dirty = true
			continue
		}
		rows += len(l.hours[h])
	}
}

// Since is each key's use of each model in the whole hours from the one
// holding since to now, by key then model.
func (l *Ledger) Since(since time.Time) []Row {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := since.Unix() / 3600 * 3600
	sum := map[pair]*Use{}
	for h, m := range l.hours {
		if h < from {
			continue
		}
		for p, u := range m {
			if sum[p] == nil {
				sum[p] = &Use{}
			}
			sum[p].add(*u)
		}
	}
	return rows(sum)
}

// Total is each key's use of each model since the ledger began (usage.json
// kept), by key then model: what the metrics count.
func (l *Ledger) Total() []Row {
	l.mu.Lock()
	defer l.mu.Unlock()
	return rows(l.total)
}

func rows(m map[pair]*Use) []Row {
	out := make([]Row, 0, len(m))
	for p, u := range m {
		out = append(out, Row{Key: p.key, Model: p.model, Use: *u})
	}
	slices.SortFunc(out, func(a, b Row) int { return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Model, b.Model)) })
	return out
}

// Today is key's use in the day holding now (the host's day, from
// midnight in its time zone): GPU hours (whole GPUs held on its behalf)
// and tokens in and out, with the requests in flight charged up to now;
// and when the day ends.
func (l *Ledger) Today(key string, now time.Time) (gpuHours float64, tokens int64, end time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setAt(now)
	for name, m := range l.meters {
		if m.inflight[key] > 0 {
			m.advance(now, name, l)
		}
	}
	d := l.day(key)
	return d.GPUSeconds / 3600, d.Tokens, l.dayEnd
}

// Save writes usage.json when something changed since the last save.
func (l *Ledger) Save() error {
	l.saving.Lock()
	defer l.saving.Unlock()
	l.mu.Lock()
	if !l.dirty || l.path == "" {
		l.mu.Unlock()
		return nil
	}
	f := file{Version: 1, Total: rows(l.total), Date: l.date}
	for _, h := range slices.Sorted(maps.Keys(l.hours)) {
		for _, r := range rows(l.hours[h]) {
			f.Hours = append(f.Hours, hourRow{Hour: h, Row: r})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(l.today)) {
		f.Today = append(f.Today, dayRow{Key: k, day: *l.today[k]})
	}
	l.dirty = false
	l.mu.Unlock()
	data, err := json.Marshal(f)
	if err == nil {
		err = statefile.Write(l.path, data, 0o640)
	}
	if err != nil {
		l.mu.Lock()
		l.dirty = true
		l.mu.Unlock()
		return fmt.Errorf("usage: %w", err)
	}
	return nil
}
