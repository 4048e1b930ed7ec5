package warmweights

import (
	"fmt"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/estimate"
	"github.com/napd/napd/sleepmode"
)

// Notes are what `napd --check` says of the weights it would keep warm:
// per model with weight files, how many and how big, and whether its
// engine is ever stopped (only then are they kept warm).
func Notes(cfg *config.Config) []string {
	var notes []string
	for _, m := range cfg.Models {
		files := estimate.WeightFiles(m.Command, m.Weights)
		if len(files) == 0 {
			continue
		}
		var total int64
		for _, f := range files {
			total += f.Size
		}
		plural := "s"
		if len(files) == 1 {
			plural = ""
		}
		what := fmt.Sprintf("weights of %s: %d file%s, %s", m.Name, len(files), plural, gib(total))
		switch {
		case cfg.Policy.WarmWeights == 0:
			notes = append(notes, what+`, not kept warm (warm_weights = "off")`)
		case m.Sleep != sleepmode.Stop && m.DeepSleep != sleepmode.Stop:
			notes = append(notes, fmt.Sprintf("%s, not kept warm: its engine is never stopped (sleep = %q, deep_sleep = %q)", what, m.Sleep, m.DeepSleep))
		default:
			notes = append(notes, what+", kept warm while its engine is stopped and host memory allows")
		}
	}
	return notes
}
