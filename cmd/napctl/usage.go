package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/napd/napd/agent/control"
)

func (c *cli) usage(ctx context.Context, args []string) error {
	var asJSON bool
	since := 24 * time.Hour
	if _, err := c.subFlags("usage", "usage [--since 24h] [--json]", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&since, "since", since, "how far back, in whole hours (at most 168h)")
		fs.BoolVar(&asJSON, "json", false, "print the figures as JSON")
	}); err != nil {
		return err
	}
	u, err := c.client().Usage(ctx, since)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(u)
	}
	printUsage(c.out, u)
	return nil
}

// printUsage writes the usage table a person reads: per key and model,
// then the day's use of the keys with a quota.
func printUsage(w io.Writer, u control.Usage) {
	fmt.Fprintf(w, "since %s (whole hours)\n\n", u.Since.Local().Format("2006-01-02 15:04 MST"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODEL\tGPU HOURS\tGiB-HOURS\tWAKES\tSWAPS\tPROMPT\tCOMPLETION")
	for _, r := range u.Rows {
		key := r.Key
		if key == "" {
			key = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.1f\t%d\t%d\t%d\t%d\n", key, r.Model, r.GPUHours, r.GPUByteSeconds/(1<<30)/3600,
			r.Wakes, r.Swaps, r.PromptTokens, r.CompletionTokens)
	}
	if len(u.Rows) == 0 {
		fmt.Fprintln(tw, "(nothing used)")
	}
	tw.Flush()
	if len(u.Quotas) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUOTA TODAY\tGPU HOURS\tTOKENS\tRENEWS")
	for _, q := range u.Quotas {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", q.Key, ofLimit(fmt.Sprintf("%.3f", q.GPUHours), q.GPUHoursPerDay > 0, fmt.Sprintf("%g", q.GPUHoursPerDay)),
			ofLimit(fmt.Sprint(q.Tokens), q.TokensPerDay > 0, fmt.Sprint(q.TokensPerDay)), q.Renews.Local().Format("2006-01-02 15:04 MST"))
	}
	tw.Flush()
}

// ofLimit is "used of limit", or used alone when there is no limit.
func ofLimit(used string, limited bool, limit string) string {
	if !limited {
		return used
	}
	return used + " of " + limit
}
