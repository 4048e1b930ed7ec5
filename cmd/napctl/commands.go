package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/lifecycle"
)

func (c *cli) client() *control.Client { return control.NewClient(c.socketPath()) }

func (c *cli) status(ctx context.Context, args []string) error {
	var asJSON bool
	if _, err := c.subFlags("status", "status [--json]", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the status as JSON")
	}); err != nil {
		return err
	}
	st, err := c.client().Status(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(c.out, st, time.Now())
	return nil
}

// vendorOf is a GPU's vendor for the status line, "[amd] " ("" from a napd
// that does not say).
func vendorOf(g control.GPUMemory) string {
	if g.Vendor == "" {
		return ""
	}
	return "[" + g.Vendor + "] "
}

// printStatus writes the table a person reads at a glance.
func printStatus(w io.Writer, st control.Status, now time.Time) {
	fmt.Fprintf(w, "napd %s · supervisor %s · %d models", st.Version, st.Supervisor, len(st.Models))
	if st.Host.AvailableBytes > 0 {
		fmt.Fprintf(w, " · host %s available of %s", bytesStr(st.Host.AvailableBytes), bytesStr(st.Host.TotalBytes))
	}
	if st.Host.PSISomeAvg10 != nil {
		fmt.Fprintf(w, " · psi %.1f", *st.Host.PSISomeAvg10)
	}
	fmt.Fprintln(w)
	for _, g := range st.GPUs {
		fmt.Fprintf(w, "gpu %d %s%s: %s free of %s\n", g.Index, vendorOf(g), g.Name, bytesStr(g.FreeBytes), bytesStr(g.TotalBytes))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tSTATE\tLEASES\tQUEUE\tIDLE\tLAST WAKE\tMEMORY\tGPU\tREASON")
	for _, m := range st.Models {
		idle := "-"
		if m.IdleSince != nil {
			idle = durStr(now.Sub(*m.IdleSince))
		}
		wake := "-"
		if m.LastWakeMs > 0 {
			wake = durStr(time.Duration(m.LastWakeMs) * time.Millisecond)
		}
		mem := "-"
		if m.EngineBytes != nil {
			mem = bytesStr(*m.EngineBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n",
			m.Name, m.State, m.Leases, m.QueueDepth, idle, wake, mem, gpuStr(m.GPUBytes), m.Reason)
	}
	tw.Flush()
	for _, m := range st.Models {
		if m.FootprintSource == control.FootprintEstimated {
			fmt.Fprintf(w, "%s: footprint %s estimated from %s (until measured)\n", m.Name, bytesStr(m.Footprint), m.FootprintFrom)
		}
		if m.WeightsResident != nil {
			fmt.Fprintf(w, "%s: weights %s of %s in the page cache\n", m.Name, bytesStr(*m.WeightsResident), bytesStr(m.Weights))
		}
		if m.Load != nil {
			fmt.Fprintln(w, m.Load.Status().Text(m.Name))
		}
		if m.SleptWith != "" && m.State == lifecycle.Sleeping.String() {
			fmt.Fprintf(w, "%s: asleep with %s\n", m.Name, m.SleptWith)
		}
		if m.Placement != "" {
			fmt.Fprintf(w, "%s: gpus chosen: %s\n", m.Name, m.Placement)
		}
		if m.WaitingFor != "" {
			fmt.Fprintf(w, "%s: %d waiting for GPU memory held by %s\n", m.Name, m.RoomWaiting, m.WaitingFor)
		}
		if m.Remote != "" {
			fmt.Fprintf(w, "%s: remote %s", m.Name, m.Remote)
			if m.RemoteState != "" {
				fmt.Fprintf(w, " · remote_state %s", m.RemoteState)
			}
			fmt.Fprintln(w)
		}
	}
}

func gpuStr(per map[string]int64) string {
	if len(per) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + bytesStr(per[k])
	}
	return strings.Join(parts, ",")
}

func bytesStr(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func durStr(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func (c *cli) wake(ctx context.Context, args []string) error {
	rest, err := c.subFlags("wake", "wake MODEL", args, nil)
	if err != nil {
		return err
	}
	model, err := oneModel("wake", rest)
	if err != nil {
		return err
	}
	tty := isTerminal(c.out)
	start := time.Now()
	phase := "requested"
	var load *control.LoadProgress
	var ticker <-chan time.Time
	if tty {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		ticker = t.C
	}
	progress := make(chan control.Progress, 16)
	done := make(chan error, 1)
	go func() {
		done <- c.client().Wake(ctx, model, func(p control.Progress) { progress <- p })
	}()
	line := func() {
		fmt.Fprintf(c.out, "\r\033[K%s", wakeLine(model, phase, load, time.Since(start)))
	}
	for {
		select {
		case p := <-progress:
			// A load line off a terminal only at each tenth of the weights.
			quiet := p.Phase == phase && p.Load != nil && load != nil && loadStep(p.Load) == loadStep(load)
			phase, load = p.Phase, p.Load
			switch {
			case tty:
				line()
			case p.Done || p.Phase == lifecycle.Awake.String() || quiet: // the final line says it
			case load != nil:
				fmt.Fprintln(c.out, wakeLine(model, phase, load, time.Duration(p.ElapsedMs)*time.Millisecond))
			default:
				fmt.Fprintf(c.out, "%s: %s (%s)\n", model, p.Phase, durStr(time.Duration(p.ElapsedMs)*time.Millisecond))
			}
		case <-ticker:
			line()
		case err := <-done:
			for len(progress) > 0 {
				phase = (<-progress).Phase
			}
			if tty {
				fmt.Fprint(c.out, "\r\033[K")
			}
			if err != nil {
				return fmt.Errorf("wake %s failed after %s: %w", model, durStr(time.Since(start)), err)
			}
			fmt.Fprintf(c.out, "%s: awake after %s\n", model, durStr(time.Since(start)))
			return nil
		}
	}
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (c *cli) sleep(ctx context.Context, args []string) error {
	var strategy string
	rest, err := c.subFlags("sleep", "sleep MODEL [--strategy S]", args, func(fs *flag.FlagSet) {
		fs.StringVar(&strategy, "strategy", "", "sleep strategy (default: the model's sleep setting)")
	})
	if err != nil {
		return err
	}
	model, err := oneModel("sleep", rest)
	if err != nil {
		return err
	}
	if err := c.client().Sleep(ctx, model, strategy); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "%s: asleep\n", model)
	return nil
}

func (c *cli) reset(ctx context.Context, args []string) error {
	rest, err := c.subFlags("reset", "reset MODEL", args, nil)
	if err != nil {
		return err
	}
	model, err := oneModel("reset", rest)
	if err != nil {
		return err
	}
	if err := c.client().Reset(ctx, model); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "%s: reset\n", model)
	return nil
}

func (c *cli) logs(ctx context.Context, args []string) error {
	n := 50
	rest, err := c.subFlags("logs", "logs MODEL [-n N]", args, func(fs *flag.FlagSet) {
		fs.IntVar(&n, "n", 50, "number of lines")
	})
	if err != nil {
		return err
	}
	model, err := oneModel("logs", rest)
	if err != nil {
		return err
	}
	lines, err := c.client().Logs(ctx, model, n)
	if err != nil {
		return err
	}
	for _, l := range lines {
		fmt.Fprintln(c.out, l)
	}
	return nil
}

func (c *cli) reload(ctx context.Context, args []string) error {
	if _, err := c.subFlags("reload", "reload", args, nil); err != nil {
		return err
	}
	if err := c.client().Reload(ctx); err != nil {
		return err
	}
	fmt.Fprintln(c.out, "config reloaded")
	return nil
}

func (c *cli) events(ctx context.Context, args []string) error {
	var follow bool
	if _, err := c.subFlags("events", "events [-f]", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&follow, "f", false, "keep following new events")
	}); err != nil {
		return err
	}
	if !follow {
		// Without -f, print what arrives in a short window: the stream has
		// no history, so this shows activity happening right now.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	return c.client().Events(ctx, func(e control.Event) {
		fmt.Fprintln(c.out, eventLine(e))
	})
}

func eventLine(e control.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", e.Time.Local().Format("15:04:05.000"), e.Model, e.Kind)
	if e.From != "" || e.To != "" {
		fmt.Fprintf(&b, " %s→%s", e.From, e.To)
	}
	if e.WakeMs > 0 {
		fmt.Fprintf(&b, " in %s", durStr(time.Duration(e.WakeMs)*time.Millisecond))
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " (%s)", e.Reason)
	}
	if e.Load != nil {
		b.WriteString(strings.TrimPrefix(e.Load.Status().Text(""), " loading"))
	}
	return b.String()
}

func (c *cli) configCmd(args []string) error {
	if len(args) == 0 || (args[0] != "check" && args[0] != "show") {
		return usageError{"config: want 'config check [FILE]' or 'config show [MODEL]'"}
	}
	if args[0] == "show" {
		return c.configShow(args[1:])
	}
	rest, err := c.subFlags("config check", "config check [FILE]", args[1:], nil)
	if err != nil {
		return err
	}
	path := c.config
	switch len(rest) {
	case 0:
	case 1:
		path = rest[0]
	default:
		return usageError{"config check: at most one FILE"}
	}
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "%s: ok (%s)\n", path, cfg.Summary())
	return nil
}

// configShow prints the effective configuration of --config and its
// drop-ins, or of one model.
func (c *cli) configShow(args []string) error {
	rest, err := c.subFlags("config show", "config show [MODEL]", args, nil)
	if err != nil {
		return err
	}
	if len(rest) > 1 {
		return usageError{"config show: at most one MODEL"}
	}
	cfg, err := config.Load(c.config)
	if err != nil {
		return err
	}
	var model string
	if len(rest) == 1 {
		model = rest[0]
	}
	return cfg.Show(c.out, model)
}
