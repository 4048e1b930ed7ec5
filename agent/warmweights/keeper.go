package warmweights

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/estimate"
	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/agent/model"
	"github.com/napd/napd/probes/host"
	"github.com/napd/napd/sleepmode"
)

// Recheck is how often residency is measured again with no change of
// state: what the kernel evicted since is warmed again then.
const Recheck = 30 * time.Second

// Rate paces napd's warming (pagecache.Cache's Rate): 2 GiB in about ten
// seconds, 140 GiB in twelve minutes, once per stop. At the disk's full
// speed the kernel's work of reading in slowed a request stream on a busy
// 2-CPU host by a third (docs/bench.md#weights-kept-warm).
const Rate = 200 << 20

// Cache is the page cache (probes/pagecache in napd).
type Cache interface {
	Resident(path string) (resident, size int64, err error)
	Warm(ctx context.Context, path string) error
	Drop(path string) error
}

// Deps is what the keeper uses from the rest of napd.
type Deps struct {
	// Models are the snapshots of the local models now.
	Models func() []model.Snapshot
	// Config is the config running now: [policy] warm_weights and
	// [pressure] host_reserve and psi_some_avg10.
	Config func() *config.Config
	Host   host.Probe
	Cache  Cache
	// Clock is napd's clock; After a timer on it (time.After in napd).
	Clock func() time.Time
	After func(time.Duration) <-chan time.Time
	Log   *slog.Logger
}

// Residency is how much of a model's weight files is in the page cache.
type Residency struct {
	Resident, Bytes int64
}

// Keeper performs Decide: one goroutine (Run) measures residency, warms
// and drops, at each state change of a model (Poke) and every Recheck.
type Keeper struct {
	d    Deps
	kick chan struct{} // buffered 1

	mu     sync.Mutex
	shown  map[string]Residency // by model, for status and metrics
	cancel context.CancelFunc   // of the warm under way, nil when none
	// Of Run's goroutine alone: the models whose weights napd warmed
	// while their engine is stopped.
	warmed map[string]bool
}

// New returns the keeper; Run runs it.
func New(d Deps) *Keeper {
	if d.After == nil {
		d.After = time.After
	}
	return &Keeper{d: d, kick: make(chan struct{}, 1), shown: map[string]Residency{}, warmed: map[string]bool{}}
}

// Poke is told of every state change of a model: an engine that stopped
// is warmed now, and a warm under way stops at once (the next pass goes
// on with it unless a wake is loading), so that a wake never waits
// behind it. It does not block.
func (k *Keeper) Poke() {
	k.mu.Lock()
	if k.cancel != nil {
		k.cancel()
	}
	k.mu.Unlock()
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Residency is the model's weights residency as last measured; false
// when it has no weight files napd knows of.
func (k *Keeper) Residency(model string) (Residency, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r, ok := k.shown[model]
	return r, ok
}

// Run passes at each Poke and every Recheck until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	for {
		k.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-k.kick:
		case <-k.d.After(Recheck):
		}
	}
}

// weightSet is one model's weight files as one pass measured them.
type weightSet struct {
	files []estimate.File
	Residency
}

// Pass measures every model's weights residency, decides, drops and
// warms. Run calls it; a test may too.
func (k *Keeper) Pass(ctx context.Context) {
	snaps := k.d.Models()
	now := k.d.Clock()
	sets := make(map[string]weightSet, len(snaps))
	var cands []Candidate
	loading := false
	for _, s := range snaps {
		c := s.Config
		loading = loading || s.Lifecycle.State == lifecycle.Waking
		ws := k.measure(estimate.WeightFiles(c.Command, c.Weights))
		if len(ws.files) == 0 {
			continue
		}
		sets[c.Name] = ws
		if !stopped(s) {
			delete(k.warmed, c.Name) // its engine owns its files again
			continue
		}
		cands = append(cands, Candidate{Model: c.Name, Bytes: ws.Bytes, Resident: ws.Resident, Warmed: k.warmed[c.Name],
			InWindow: c.InWindow(now), WarmOnStart: c.WarmOnStart, LastUsed: s.LastUsed})
	}
	k.show(sets)
	cfg := k.d.Config()
	dec := Decide(cands, cfg.Policy.WarmWeights, k.host(ctx, cfg.Pressure))
	for _, name := range dec.Drop {
		k.drop(name, sets[name], dec.Why)
	}
	if loading {
		return // a wake reads from the disk now: warming waits for it
	}
	for _, name := range dec.Warm {
		if !k.warm(ctx, name, sets[name], dec.Why) {
			return
		}
	}
	if len(dec.Warm) > 0 {
		k.show(k.remeasure(sets))
	}
}

// stopped reports whether the model's engine is stopped: no engine holds
// its weights, in GPU or host memory.
func stopped(s model.Snapshot) bool {
	if s.Lifecycle.State != lifecycle.Sleeping {
		return false
	}
	return s.Slept == sleepmode.Stop || (s.Slept == "" && s.Config.Sleep == sleepmode.Stop)
}

func (k *Keeper) host(ctx context.Context, p config.Pressure) Host {
	snap, err := k.d.Host.Snapshot(ctx)
	if err != nil {
		k.d.Log.Debug("warm weights: no host memory reading", "err", err)
		return Host{}
	}
	return Host{MemAvailable: snap.MemAvailable, HaveMem: true, Reserve: p.HostReserve,
		Pressed: snap.HavePSI && snap.PSI.Some.Avg10 > p.PSISomeAvg10}
}

// measure is the residency of files; a file that cannot be read counts
// as not resident.
func (k *Keeper) measure(files []estimate.File) weightSet {
	ws := weightSet{files: files}
	for _, f := range files {
		ws.Bytes += f.Size
		if r, _, err := k.d.Cache.Resident(f.Path); err == nil {
			ws.Resident += r
		}
	}
	return ws
}

func (k *Keeper) remeasure(sets map[string]weightSet) map[string]weightSet {
	out := make(map[string]weightSet, len(sets))
	for name, ws := range sets {
		out[name] = k.measure(ws.files)
	}
	return out
}

func (k *Keeper) show(sets map[string]weightSet) {
	shown := make(map[string]Residency, len(sets))
	for name, ws := range sets {
		shown[name] = ws.Residency
	}
	k.mu.Lock()
	k.shown = shown
	k.mu.Unlock()
}

func (k *Keeper) drop(name string, ws weightSet, why string) {
	for _, f := range ws.files {
		if err := k.d.Cache.Drop(f.Path); err != nil {
			k.d.Log.Warn("warm weights: drop failed", "model", name, "file", f.Path, "err", err)
		}
	}
	delete(k.warmed, name)
	k.d.Log.Info("warm weights dropped", "model", name, "resident_bytes", ws.Resident, "why", why)
}

// warm reads the model's files in; false when a Poke or ctx stopped it.
func (k *Keeper) warm(ctx context.Context, name string, ws weightSet, why string) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	k.mu.Lock()
	k.cancel = cancel
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.cancel = nil
		k.mu.Unlock()
	}()
	start := k.d.Clock()
	for _, f := range ws.files {
		if err := k.d.Cache.Warm(wctx, f.Path); err != nil {
			if wctx.Err() != nil {
				return false
			}
			k.d.Log.Warn("warm weights: warm failed", "model", name, "file", f.Path, "err", err)
		}
	}
	k.warmed[name] = true
	k.d.Log.Info("weights warmed", "model", name, "bytes", ws.Bytes, "were_resident", ws.Resident,
		"seconds", k.d.Clock().Sub(start).Seconds(), "budget", why)
	return true
}
