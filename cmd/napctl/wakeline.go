package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/napd/napd/agent/control"
)

// barWidth is the cells of napctl wake's progress bar.
const barWidth = 20

// wakeLine is napctl wake's line on a terminal: the phase, and while the
// engine loads a bar of its weights read with the percent and the time
// left, then the time waited: "m: waking [########------------] 43 %
// (7.1 of 16.4 GiB), about 12 s left, 5.2s".
func wakeLine(model, phase string, load *control.LoadProgress, waited time.Duration) string {
	if load == nil {
		return fmt.Sprintf("%s: %s %s", model, phase, durStr(waited))
	}
	s := load.Status()
	text := strings.TrimPrefix(s.Text(model), model+" loading")
	bar := ""
	if s.HaveFraction {
		full := int(s.Fraction * barWidth)
		bar = " [" + strings.Repeat("#", full) + strings.Repeat("-", barWidth-full) + "]"
	}
	return fmt.Sprintf("%s: %s%s%s, %s", model, phase, bar, text, durStr(waited))
}

// loadStep is the tenth of the weights a load has read (-1 when
// unknown): off a terminal, napctl wake prints a line when it changes.
func loadStep(load *control.LoadProgress) int {
	if load == nil || load.Progress == nil {
		return -1
	}
	return int(*load.Progress * 10)
}
