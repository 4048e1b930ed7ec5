// Package agentcheck serves HAProxy's agent-check protocol, so a load
// balancer in front of several napd hosts can send each request to a host
// where its model is awake, or wake it on one host when it is awake nowhere.
//
// HAProxy connects to the agent port, sends its agent-send string (here the
// model's name, a newline) and reads one line of words: a weight (`100%`),
// an administrative state (`ready`, `drain`) and an operational state
// (`up`, `down`), then `#` and a description shown on the stats page. See
// docs/fleet.md.
//
// It owns the protocol and its listener. It must not decide a model's
// health: it reports what its lookup says, and never wakes, admits or waits
// on a model.
package agentcheck

import (
	"errors"
	"fmt"
	"strings"
)

// Health is what a balancer is told about one model on this host.
type Health int

const (
	// Unknown: no such model here. Answered `down`.
	Unknown Health = iota
	// Serving: the model is awake, or a wake is under way and requests
	// queue for it (so the requests after the one that woke it follow it).
	// Answered `up ready 100%`.
	Serving
	// Wakeable: asleep, and a request would wake it. Answered `up ready 1%`,
	// or `up ready 0%` to an `awake` request.
	Wakeable
	// Draining: takes no new work for now (a sleep is under way, or a wake
	// waits for GPU memory other models hold). Answered `up drain`.
	Draining
	// Failed: refuses every request until an operator resets it. Answered
	// `down`.
	Failed
)

// Status is one model's state as the agent reports it.
type Status struct {
	Health     Health
	State      string // the state in words, for the description
	QueueDepth int    // requests waiting for a slot or a wake
}

// Mode is how a request wants sleeping models weighted.
type Mode int

const (
	// ModeWake (a bare model name): a sleeping model gets a low weight, so
	// a balancer may pick this host to wake it.
	ModeWake Mode = iota
	// ModeAwake (`MODEL awake`): a sleeping model gets weight 0, so only
	// hosts where it is awake take requests. docs/fleet.md pairs such
	// servers with `backup` servers in ModeWake.
	ModeAwake
)

// Request is a parsed agent request line.
type Request struct {
	Model string
	Mode  Mode
}

// ParseRequest parses one request line (its end of line included or not):
// a model name or alias, optionally followed by the word `awake`, separated
// by spaces or tabs. Names are printable ASCII without spaces, as aliases
// are in the config.
func ParseRequest(line string) (Request, error) {
	line = strings.TrimSuffix(line, "\n")
	line = strings.TrimSuffix(line, "\r")
	for i := 0; i < len(line); i++ {
		if c := line[i]; (c < ' ' && c != '\t') || c >= 0x7f {
			return Request{}, fmt.Errorf("byte 0x%02x at %d: want printable ASCII", c, i)
		}
	}
	words := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' })
	switch {
	case len(words) == 0:
		return Request{}, errors.New("empty request: want a model name")
	case len(words) > 2:
		return Request{}, fmt.Errorf("%d words: want MODEL or MODEL awake", len(words))
	case len(words) == 2 && words[1] != "awake":
		return Request{}, fmt.Errorf("unknown mode %q: want MODEL or MODEL awake", words[1])
	}
	r := Request{Model: words[0]}
	if len(words) == 2 {
		r.Mode = ModeAwake
	}
	return r, nil
}

// Answer is the reply line to req for a model in st (known false: no
// such model), newline included. The description after `#` names the
// state and the queue depth.
func Answer(req Request, st Status, known bool) string {
	if !known {
		return fmt.Sprintf("down #no model %s\n", req.Model)
	}
	var words string
	switch st.Health {
	case Serving:
		words = "up ready 100%"
	case Wakeable:
		words = "up ready 1%"
		if req.Mode == ModeAwake {
			words = "up ready 0%"
		}
	case Draining:
		// `up`: a drain is no failure; HAProxy keeps the server's
		// connections and, after `ready`, its place.
		words = "up drain"
	default:
		words = "down"
	}
	return fmt.Sprintf("%s #%s, %d queued\n", words, st.State, st.QueueDepth)
}

// refusal is the reply to a request line that does not parse: `down`, so
// a misconfigured agent-send is visible on the stats page.
func refusal(err error) string {
	return "down #napd: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n"
}
