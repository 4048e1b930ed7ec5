package warmweights

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/internal/fakeclock"
	"github.com/napd/napd/probes/host"
	"github.com/napd/napd/probes/pagecache"
	"github.com/napd/napd/sleepmode"
	"github.com/shirou/gopsutil/v4/mem"
)

// spy is the real page cache, with the calls it was asked for counted.
type spy struct {
	pagecache.Cache
	mu           sync.Mutex
	warms, drops []string
	// block, when set, makes Warm wait for its ctx (a slow disk).
	block   bool
	entered chan struct{}
}

func (s *spy) Warm(ctx context.Context, path string) error {
	s.mu.Lock()
	s.warms = append(s.warms, filepath.Base(filepath.Dir(path)))
	block := s.block
	s.mu.Unlock()
	if block {
		select { // told once per wait; a later warm does not wait for the test
		case s.entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Cache.Warm(ctx, path)
}

func (s *spy) Drop(path string) error {
	s.mu.Lock()
	s.drops = append(s.drops, filepath.Base(filepath.Dir(path)))
	s.mu.Unlock()
	return s.Cache.Drop(path)
}

func (s *spy) calls() (warms, drops []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, d := slices.Compact(slices.Clone(s.warms)), slices.Compact(slices.Clone(s.drops))
	s.warms, s.drops = nil, nil
	return w, d
}

// hostSeam is the host probe with MemAvailable and PSI the test sets.
type hostSeam struct {
	reader *host.Reader
	psi    string
	mu     sync.Mutex
	avail  uint64
}

func newHostSeam(t *testing.T) *hostSeam {
	h := &hostSeam{psi: filepath.Join(t.TempDir(), "memory"), avail: 100 << 30}
	h.reader = &host.Reader{PSIPath: h.psi, VirtualMemory: func(context.Context) (*mem.VirtualMemoryStat, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return &mem.VirtualMemoryStat{Total: 128 << 30, Available: h.avail}, nil
	}}
	h.setPSI(t, 0)
	return h
}

func (h *hostSeam) setAvail(b uint64) { h.mu.Lock(); h.avail = b; h.mu.Unlock() }

func (h *hostSeam) setPSI(t *testing.T, avg10 float64) {
	text := fmt.Sprintf("some avg10=%.2f avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", avg10)
	if err := os.WriteFile(h.psi, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fixture is a keeper over models whose weights are real files.
type fixture struct {
	t     *testing.T
	k     *Keeper
	cache *spy
	host  *hostSeam
	clock *fakeclock.Clock
	mu    sync.Mutex
	snaps []model.Snapshot
	cfg   *config.Config
}

const fileSize = 2*pagecache.Chunk + 4096

// newFixture has one model per name, stopped, each with a weights
// directory of one file (evicted), used in the order named (the last most
// recently).
func newFixture(t *testing.T, names ...string) *fixture {
	f := &fixture{t: t, cache: &spy{entered: make(chan struct{}, 1)}, host: newHostSeam(t),
		clock: fakeclock.New(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)), cfg: &config.Config{}}
	f.cfg.Policy.WarmWeights = config.WarmWeightsAuto
	f.cfg.Pressure = config.Pressure{HostReserve: 2 << 30, PSISomeAvg10: 20}
	root := t.TempDir()
	for i, name := range names {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, "w.safetensors")
		if err := os.WriteFile(file, make([]byte, fileSize), 0o644); err != nil {
			t.Fatal(err)
		}
		syncFile(t, file)
		if err := f.cache.Cache.Drop(file); err != nil {
			t.Fatal(err)
		}
		if r, _, _ := f.cache.Cache.Resident(file); r == fileSize {
			t.Skip("the kernel keeps pages after POSIX_FADV_DONTNEED here (tmpfs?): eviction is not observable")
		}
		c := &config.Model{Name: name, Command: []string{"engine"}, Weights: []string{dir}, Sleep: sleepmode.Stop}
		f.snaps = append(f.snaps, model.Snapshot{Config: c, Lifecycle: lifecycle.Snapshot{State: lifecycle.Sleeping},
			Slept: sleepmode.Stop, LastUsed: f.clock.Now().Add(time.Duration(i-len(names)) * time.Minute)})
	}
	f.k = New(Deps{
		Models: func() []model.Snapshot { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.snaps) },
		Config: func() *config.Config { return f.cfg },
		Host:   f.host.reader, Cache: f.cache, Clock: f.clock.Now, After: f.clock.After,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return f
}

func syncFile(t *testing.T, path string) {
	t.Helper()
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if err := fd.Sync(); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) setState(name string, st lifecycle.State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.snaps {
		if f.snaps[i].Config.Name == name {
			f.snaps[i].Lifecycle.State = st
		}
	}
}

func (f *fixture) pass(wantWarms, wantDrops []string) {
	f.t.Helper()
	f.k.Pass(context.Background())
	warms, drops := f.cache.calls()
	if !slices.Equal(warms, wantWarms) || !slices.Equal(drops, wantDrops) {
		f.t.Fatalf("warmed %q dropped %q, want warmed %q dropped %q", warms, drops, wantWarms, wantDrops)
	}
}

// settle waits (bounded) until the reads a warm queued are done:
// readahead returns before them.
func (f *fixture) settle() {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range f.snaps {
		path := filepath.Join(s.Config.Weights[0], "w.safetensors")
		for {
			r, _, err := f.cache.Cache.Resident(path)
			if err != nil {
				f.t.Fatal(err)
			}
			if r == fileSize || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func TestKeeper_WarmsStoppedModelsAndShowsResidency(t *testing.T) {
	f := newFixture(t, "a", "b", "awake")
	f.setState("awake", lifecycle.Awake)
	f.pass([]string{"b", "a"}, nil) // most recently used first; the awake one is its engine's
	// readahead returns once queued: the count follows the reads, bounded.
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.k.Pass(context.Background()) // measures again; warms what is still missing
		r, ok := f.k.Residency("a")
		if ok && r.Resident == fileSize && r.Bytes == fileSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("residency of a = %+v, %v; want %d of %d", r, ok, fileSize, fileSize)
		}
	}
	f.cache.calls()
	f.pass(nil, nil) // all resident: nothing to do
	if r, ok := f.k.Residency("awake"); !ok || r.Bytes != fileSize {
		t.Fatalf("an awake model's residency is shown too: %+v, %v", r, ok)
	}
	if _, ok := f.k.Residency("none"); ok {
		t.Fatal("a model without weights has a residency")
	}
}

func TestKeeper_PressureDropsLeastLikelyFirst(t *testing.T) {
	f := newFixture(t, "a", "b", "c")
	f.pass([]string{"c", "b", "a"}, nil)
	f.settle()
	f.host.setPSI(t, 50) // above psi_some_avg10: one a round, least likely first
	f.pass(nil, []string{"a"})
	f.pass(nil, []string{"b"})
	f.host.setPSI(t, 0)
	f.host.setAvail(1 << 30) // below host_reserve: warm nothing, drop the rest
	f.pass(nil, []string{"c"})
	f.pass(nil, nil) // nothing napd warmed is left
	if r, _ := f.k.Residency("a"); r.Resident >= fileSize {
		t.Logf("the kernel kept a's pages after POSIX_FADV_DONTNEED (%d bytes)", r.Resident)
	}
	f.host.setAvail(100 << 30) // relieved: warmed again, likeliest first
	f.pass([]string{"c", "b", "a"}, nil)
}

func TestKeeper_BudgetAndOff(t *testing.T) {
	f := newFixture(t, "a", "b")
	f.cfg.Policy.WarmWeights = fileSize + 1 // one fits
	f.pass([]string{"b"}, nil)
	f.cfg.Policy.WarmWeights = 0
	f.pass(nil, []string{"b"})
}

func TestKeeper_NoWarmWhileAWakeLoads(t *testing.T) {
	f := newFixture(t, "a", "b")
	f.setState("b", lifecycle.Waking)
	f.pass(nil, nil)
	f.setState("b", lifecycle.Awake)
	f.pass([]string{"a"}, nil)
}

// A Poke (a model changed state: a wake starts) stops the warm under way
// at once, and it does not count as warmed.
func TestKeeper_PokeStopsAWarm(t *testing.T) {
	f := newFixture(t, "a")
	f.cache.block = true
	done := make(chan struct{})
	go func() { defer close(done); f.k.Pass(context.Background()) }()
	<-f.cache.entered // warming a, on a disk that does not answer
	f.k.Poke()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pass still warms after a Poke")
	}
	if f.k.warmed["a"] {
		t.Fatal("a stopped warm counts as warmed")
	}
	// Run's first pass warms again; ctx's end stops it too.
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); f.k.Run(ctx) }()
	<-f.cache.entered
	cancel()
	<-ran
}
