package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/napd/napd/sleepmode"
)

// SleepIdleFlag is llama-server's flag for its own idle sleep: after that
// many seconds without a task it frees its weights by itself (-1: never).
const SleepIdleFlag = "--sleep-idle-seconds"

// sleepIdleFlag finds SleepIdleFlag in a command ("--sleep-idle-seconds N"
// or "--sleep-idle-seconds=N"): its value in seconds (-1: off) and whether
// it is there. A value llama-server refuses (not a whole number, 0, below
// -1) is an error.
func sleepIdleFlag(cmd []string) (secs int, found bool, err error) {
	for i, arg := range cmd {
		v, inline := strings.CutPrefix(arg, SleepIdleFlag+"=")
		switch {
		case inline:
		case arg == SleepIdleFlag && i+1 < len(cmd):
			v = cmd[i+1]
		case arg == SleepIdleFlag:
			return 0, true, fmt.Errorf("%s has no value", SleepIdleFlag)
		default:
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 || n < -1 {
			return 0, true, fmt.Errorf("%s %q: llama-server takes whole seconds, or -1 for never", SleepIdleFlag, v)
		}
		return n, true, nil
	}
	return 0, false, nil
}

// checkSelfSleep settles the engine's own idle sleep. With sleep =
// "llamacpp" it is llama-server's --sleep-idle-seconds: the one in command
// is honoured; without one, napd adds it with the model's idle_timeout
// (whole seconds, rounded up; none when idle_timeout is 0). A command that
// sets the flag with another strategy is an error: the engine would free
// and retake GPU memory without napd knowing.
func (d *decoder) checkSelfSleep(m *Model, t *table) {
	secs, found, err := sleepIdleFlag(m.Command)
	at := t.at("command")
	switch {
	case err != nil:
		d.addAt(at, err.Error())
		return
	case m.Sleep != sleepmode.LlamaCpp:
		if found && secs > 0 {
			d.addAt(at, fmt.Sprintf(`%s makes llama-server sleep by itself, unknown to napd with sleep = %q: set sleep = "llamacpp" (napd then follows its sleep), or remove the flag`,
				SleepIdleFlag, m.Sleep))
		}
		return
	case found:
		m.SelfSleep = max(time.Duration(secs)*time.Second, 0)
	case len(m.Command) > 0 && m.IdleTimeout > 0:
		secs := int(math.Ceil(m.IdleTimeout.Seconds()))
		m.Command = append(slices.Clone(m.Command), SleepIdleFlag, strconv.Itoa(secs))
		m.SelfSleep = time.Duration(secs) * time.Second
	}
}

// selfSleepNotes are what `napd --check` says of the models whose engine
// sleeps by itself.
func (c *Config) selfSleepNotes() []string {
	var notes []string
	for _, m := range c.Models {
		switch {
		case m.Sleep != sleepmode.LlamaCpp:
		case m.SelfSleep > 0:
			notes = append(notes, fmt.Sprintf("model %s: llama-server sleeps by itself after %s without a task (%s %d)",
				m.Name, m.SelfSleep, SleepIdleFlag, int(m.SelfSleep.Seconds())))
		case len(m.Command) == 0:
			notes = append(notes, fmt.Sprintf(`model %s: sleep = "llamacpp": napd follows the sleep of its unit's llama-server, which needs %s N in the unit`, m.Name, SleepIdleFlag))
		default:
			notes = append(notes, fmt.Sprintf("model %s: llama-server never sleeps by itself (idle_timeout 0 or %s -1); napd still stops it under memory pressure", m.Name, SleepIdleFlag))
		}
	}
	return notes
}
