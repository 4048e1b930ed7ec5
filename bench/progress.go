package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/probes/pagecache"
)

// The load-progress figure (issue 34): a demo engine that reads a weights
// file at start, evicted from the page cache before each wake and read at
// a paced rate, so the load takes several seconds as a real model's does.
// napd's progress figure and time left are recorded as napctl wake gets
// them; the error of the predicted end (the reading's time plus its time
// left) against the wake's real end is taken at the first reading past
// 25, 50 and 75 % of the weights.
const (
	progressSize = 1 << 30
	progressRate = "100MiB" // about 10 s for the GiB
)

// progressModels are the engines measured: one that serves once its
// weights are read, and one with a quiet warm-up after them (its health
// turns 200 at 14 s, 4 s after the last byte), as a GPU engine's CUDA
// set-up is, which the rate so far cannot see and a learned wake time can.
var progressModels = []struct {
	name, warmUp string
}{{"demo-large", ""}, {"demo-large-warmup", "14s"}}

// progressMarks are the shares of the load the error is taken at.
var progressMarks = []float64{0.25, 0.50, 0.75}

// progressRound is one measured wake.
type progressRound struct {
	model    string
	learned  bool          // napd had learned a wake time of the model before
	took     time.Duration // from the wake's start to the model serving
	readings int
	// errs are, per mark, the predicted end less the real end (positive:
	// napd said later than it was); ok false when no reading passed it.
	errs []time.Duration
	ok   []bool
}

// progressReading is one line of napctl wake's stream with a load.
type progressReading struct {
	at       time.Time
	fraction float64
	left     time.Duration
}

// runProgress measures rounds wakes of the demo model with its weights
// evicted, in a file under dir ("" = the system's temporary directory,
// which must be on a disk for the eviction to mean anything).
func runProgress(ctx context.Context, binDir, dir string, rounds int) ([]progressRound, error) {
	n, err := newNapd("napd", "napd-bench-progress-")
	if err != nil {
		return nil, err
	}
	defer n.stop()
	weights, err := writeWeights(dir)
	if err != nil {
		return nil, err
	}
	defer os.Remove(weights)
	cfg := n.baseConfig("5m") + benchPolicy
	for _, m := range progressModels {
		delay := ""
		if m.warmUp != "" {
			delay = fmt.Sprintf(", %q, %q", "--startup-delay", m.warmUp)
		}
		cfg += fmt.Sprintf(`
[models.%s]
command = [%q, "--host", "127.0.0.1", "--port", "${PORT}", "--model", %q, "--load-file", %q, "--load-rate", %q%s]
sleep = "stop"
`, m.name, filepath.Join(binDir, "napd-demo-engine"), m.name, weights, progressRate, delay)
	}
	if err := n.launch(binDir, cfg, nil); err != nil {
		return nil, err
	}
	c := control.NewClient(n.socket)
	var out []progressRound
	for _, m := range progressModels {
		for i := range rounds {
			if err := (pagecache.Cache{}).Drop(weights); err != nil {
				return nil, fmt.Errorf("evict the weights: %w", err)
			}
			r, err := progressWake(ctx, c, m.name)
			if err != nil {
				return nil, fmt.Errorf("%s, round %d: %w", m.name, i+1, err)
			}
			r.learned = i > 0
			out = append(out, r)
			if err := c.Sleep(ctx, m.name, ""); err != nil {
				return nil, fmt.Errorf("%s, round %d: sleep: %w", m.name, i+1, err)
			}
		}
	}
	return out, nil
}

// writeWeights writes progressSize bytes of random data (no file system
// compresses them away) to a file the engine's command names as .gguf,
// so napd finds it as the model's weights, and flushes it to the disk.
func writeWeights(dir string) (string, error) {
	f, err := os.CreateTemp(dir, "napd-bench-weights-*.gguf")
	if err != nil {
		return "", err
	}
	f.Close()
	return f.Name(), writeRandom(f.Name(), progressSize)
}

// progressWake wakes the model with napctl's call, recording each reading
// of its load, and works out the errors at the marks.
func progressWake(ctx context.Context, c *control.Client, model string) (progressRound, error) {
	var mu sync.Mutex
	var readings []progressReading
	start := time.Now()
	err := c.Wake(ctx, model, func(p control.Progress) {
		if p.Load == nil || p.Load.Progress == nil || p.Load.LeftMs == nil {
			return
		}
		mu.Lock()
		readings = append(readings, progressReading{at: time.Now(), fraction: *p.Load.Progress,
			left: time.Duration(*p.Load.LeftMs) * time.Millisecond})
		mu.Unlock()
	})
	end := time.Now()
	if err != nil {
		return progressRound{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	r := progressRound{model: model, took: end.Sub(start), readings: len(readings)}
	for _, mark := range progressMarks {
		i := slices.IndexFunc(readings, func(x progressReading) bool { return x.fraction >= mark })
		if i < 0 {
			r.errs, r.ok = append(r.errs, 0), append(r.ok, false)
			continue
		}
		x := readings[i]
		r.errs, r.ok = append(r.errs, x.at.Add(x.left).Sub(end)), append(r.ok, true)
	}
	return r, nil
}

// progressMarkdown renders the load-progress figures.
func (r *report) progressMarkdown(b *strings.Builder) {
	if len(r.progress) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## Load progress: the time left while a model loads\n\n")
	fmt.Fprintf(b, "| model | round | learned wake time | wake took | readings |")
	for _, m := range progressMarks {
		fmt.Fprintf(b, " error at %.0f %% |", m*100)
	}
	b.WriteString("\n|---|---|---|---|---|" + strings.Repeat("---|", len(progressMarks)) + "\n")
	round := 0
	for i, p := range r.progress {
		if i == 0 || r.progress[i-1].model != p.model {
			round = 0
		}
		round++
		learned := "none (rate only)"
		if p.learned {
			learned = "yes"
		}
		fmt.Fprintf(b, "| %s | %d | %s | %.1f s | %d |", p.model, round, learned, p.took.Seconds(), p.readings)
		for j := range progressMarks {
			if !p.ok[j] {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(b, " %+d ms (%+.1f %%) |", p.errs[j].Milliseconds(), 100*p.errs[j].Seconds()/p.took.Seconds())
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(b, `
Each round wakes a stopped demo engine (sleep = "stop") that reads a
%d MiB weights file at start at %s/s (--load-file, --load-rate), the file
evicted from the page cache (POSIX_FADV_DONTNEED) before the wake. napd
measures the bytes the engine's processes read (/proc/PID/io rchar) against
the file's size once a second; the bench records each reading as napctl
wake gets it. The error is, at the first reading past each share of the
load, the predicted end (the reading's time plus its time left) less the
wake's real end (the model serving), also as a share of the whole wake:
positive is napd saying later than it was. demo-large serves once its
weights are read; demo-large-warmup turns healthy 4 s after its last byte
(--startup-delay 14s), as a GPU engine's set-up after its weights does,
which the rate so far cannot see. The first round of each has no learned
wake time (the rate so far alone), the others blend it in
([lifecycle.md](lifecycle.md#load-progress)). `+"`go run ./bench -bin bin -progress-only`"+`
runs this table alone.
`, progressSize>>20, progressRate)
}

// runProgress runs the load-progress rounds into r.
func (r *report) runProgress(ctx context.Context, o options, step func(string) func()) error {
	done := step(fmt.Sprintf("load progress, %d wakes", o.progressRounds))
	p, err := runProgress(ctx, o.bin, o.progressDir, o.progressRounds)
	if err != nil {
		return fmt.Errorf("load progress: %w", err)
	}
	r.progress = p
	done()
	return nil
}
