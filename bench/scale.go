package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The scale figures: napd with many configured models, all asleep.

const (
	scaleModels     = 50
	statusCalls     = 20
	targetManyRSS   = 40 << 20
	targetStatus    = 50 * time.Millisecond
	targetManyOpen  = 1 << 30
	manyStreamsWant = 10000
)

// scaleFigures are napd's memory with scaleModels asleep and how fast
// `napctl status` answers there.
type scaleFigures struct {
	rss           int64
	status        latency // wall time of one `napctl status`, process start included
	statusSlowest time.Duration
	manyOpen      int   // streams open at once in the 10,000-stream run
	manyRSS       int64 // napd's RSS with them open
	manyPeak      int64
	nofile        uint64 // the open-file limit napd ran with
}

// measureScale starts a second napd with scaleModels models that are never
// woken and measures its RSS and `napctl status`.
func measureScale(ctx context.Context, binDir, self string, f *scaleFigures) error {
	dir, err := os.MkdirTemp("", "napd-bench-scale-")
	if err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	n := &napd{dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), socket: filepath.Join(dir, "control.sock"), exited: make(chan struct{})}
	var cfg strings.Builder
	cfg.WriteString(n.baseConfig("5m"))
	cfg.WriteString("\n[policy]\nidle_timeout = \"0\"\n")
	for i := range scaleModels {
		fmt.Fprintf(&cfg, "\n[models.m%02d]\ncommand = [%q, \"-engine\", \"-port\", \"${PORT}\"]\nsleep = \"stop\"\n", i, self)
	}
	if err := n.launch(binDir, cfg.String(), nil); err != nil {
		return err
	}
	defer n.stop()
	if err := waitSocket(n.socket, 15*time.Second); err != nil {
		return err
	}
	var times []time.Duration
	for range statusCalls {
		t := time.Now()
		out, err := exec.CommandContext(ctx, filepath.Join(binDir, "napctl"), "--socket", n.socket, "status").CombinedOutput()
		if err != nil {
			return fmt.Errorf("napctl status: %w: %s", err, out)
		}
		times = append(times, time.Since(t))
	}
	f.status = summarize(times)
	f.statusSlowest = times[len(times)-1]
	for range 5 { // the largest of a few samples
		rss, _, _ := n.memory()
		f.rss = max(f.rss, rss)
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// waitSocket waits until a unix socket accepts connections.
func waitSocket(path string, within time.Duration) error {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("no control socket at %s within %s", path, within)
}

// scaleMarkdown renders the scale figures.
func (r *report) scaleMarkdown(b *strings.Builder) {
	s := r.scale
	fmt.Fprintf(b, `## Scale: many streams, many models

| | figure | target | |
|---|---|---|---|
| napd RSS with %d streams open at once (%d opened) | %s (peak %s) | < 1 GiB | %s |
| napd RSS with %d configured models, all asleep | %s | < 40 MiB | %s |
| `+"`napctl status`"+` there, median of %d | %s (slowest %s) | < 50 ms | %s |

Streams: as in the table above (one chunk a second each), all through napd
to one model. Models: a second napd whose %d models (sleep = "stop") are
never woken, measured after start-up. `+"`napctl status`"+`: the wall time of the
whole command, process start included, as an operator sees it.
%s
`, manyStreamsWant, s.manyOpen, mib(s.manyRSS), mib(s.manyPeak), s.manyVerdict(),
		scaleModels, mib(s.rss), met(s.rss > 0 && s.rss < targetManyRSS),
		statusCalls, ms1(s.status.median), ms1(s.statusSlowest), met(s.status.median > 0 && s.status.median < targetStatus),
		scaleModels, s.nofileNote())
}

// manyVerdict checks the 10,000-stream RSS; where the open-file limit
// held fewer streams, against the target scaled to those that opened.
func (s scaleFigures) manyVerdict() string {
	if s.manyOpen == 0 || s.manyRSS == 0 {
		return met(false)
	}
	if s.manyOpen < manyStreamsWant && s.nofileNote() != "" {
		scaled := float64(s.manyRSS) * manyStreamsWant / float64(s.manyOpen)
		return fmt.Sprintf("%s for the %d that opened (%s scaled to %d)", met(scaled < targetManyOpen), s.manyOpen, mib(int64(scaled)), manyStreamsWant)
	}
	return met(s.manyOpen == manyStreamsWant && s.manyRSS < targetManyOpen)
}

// nofileNote explains streams refused for want of file descriptors: napd
// holds two per stream (client and engine) and caps its connections to
// what its open-file limit holds (max_connections is lowered, with a
// warning); the bench raises the limit where it may (as root with
// CAP_SYS_RESOURCE), napd.service sets LimitNOFILE=65536.
func (s scaleFigures) nofileNote() string {
	if s.manyOpen >= manyStreamsWant || s.nofile >= 2*manyStreamsWant+256 {
		return ""
	}
	return fmt.Sprintf(`
Not every stream opened here: napd ran with an open-file limit of %d, which
holds %d client connections (two descriptors each, client and engine, less
a reserve; napd lowers max_connections to that and answers the rest 503),
and this machine does not let the bench raise it. napd.service sets
LimitNOFILE=65536. The RSS figure is for the streams that opened.
`, s.nofile, (int(s.nofile)-256)/2)
}

func ms1(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
