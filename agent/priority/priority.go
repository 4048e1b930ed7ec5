// Package priority is the vocabulary and the pure rules of priority
// classes ([policy] priorities): which class a request runs in, how a
// class ages while it waits, and which queued request a model admits next.
//
// It is part of the pure core: it owns no clock, lock or goroutine. The
// gateway resolves a request's class from its key and its header, the
// model's loop admits by it, and the planner orders room turns, yields and
// evictions by it (agent/planner).
package priority

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Class is a priority class: its place in [policy] priorities, counted
// from 1, the highest. The zero Class is none: the model's default class
// applies. A reload that reorders the classes applies to new requests.
type Class uint8

// None is no class: the model's default applies.
const None Class = 0

// MaxClasses bounds [policy] priorities.
const MaxClasses = 16

// Set reports a class, not None.
func (c Class) Set() bool { return c != None }

// Above reports whether c comes before d (is of a higher class). None
// comes after every class.
func (c Class) Above(d Class) bool {
	return c.Set() && (!d.Set() || c < d)
}

// Best is the higher of two classes, None when both are.
func Best(c, d Class) Class {
	if d.Above(c) {
		return d
	}
	return c
}

// Engine is the value of an engine's own priority field for c (vLLM's
// `priority`, lower first): its place in the list counted from 0.
func (c Class) Engine() int { return int(c) - 1 }

// Resolve is a request's class: asked (the X-Napd-Priority header) when
// it is set and not above ceiling, else ceiling; ceiling is the key's
// class, or the model's default (dflt) when the key has none. A request
// may lower its own class, never raise it above its key's.
func Resolve(ceiling, asked, dflt Class) Class {
	if !ceiling.Set() {
		ceiling = dflt
	}
	if asked.Set() && !asked.Above(ceiling) {
		return asked
	}
	return ceiling
}

// Aged is the class a request of class c counts as after waiting waited:
// one class higher per age waited, never above the first. age <= 0 (or
// None) ages nothing. This is the starvation bound: a request of the
// lowest of n classes counts as the highest after (n-1) × age.
func (c Class) Aged(waited, age time.Duration) Class {
	if !c.Set() || age <= 0 || waited < age {
		return c
	}
	steps := waited / age
	if steps >= time.Duration(c-1) {
		return 1
	}
	return c - Class(steps)
}

// Classes are the names of [policy] priorities, highest first.
type Classes []string

// DefaultClasses is [policy] priorities when the file sets none.
var DefaultClasses = Classes{"interactive", "default", "batch"}

// DefaultName is the class a model's `priority` defaults to when the list
// has it (else the list's last, the lowest).
const DefaultName = "default"

// Of is the class named name; ok is false for a name not in the list.
func (cs Classes) Of(name string) (Class, bool) {
	for i, n := range cs {
		if n == name {
			return Class(i + 1), true
		}
	}
	return None, false
}

// Name is c's name; "" for None or a class not in the list.
func (cs Classes) Name(c Class) string {
	if !c.Set() || int(c) > len(cs) {
		return ""
	}
	return cs[c-1]
}

// Default is the class a model without `priority` runs its keyless
// requests in: "default" when the list has it, else the lowest.
func (cs Classes) Default() Class {
	if c, ok := cs.Of(DefaultName); ok {
		return c
	}
	return Class(len(cs))
}

// Lowest is the list's last class.
func (cs Classes) Lowest() Class { return Class(len(cs)) }

// Parse reads a class name against the list, for the keys file and the
// header: the error names the classes there are.
func (cs Classes) Parse(name string) (Class, error) {
	if c, ok := cs.Of(name); ok {
		return c, nil
	}
	return None, fmt.Errorf("unknown priority class %q (want one of %s)", name, strings.Join(cs, ", "))
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// Check validates a list for [policy] priorities: 1 to MaxClasses names,
// each [a-z][a-z0-9_-]* of at most 32 characters, none twice.
func (cs Classes) Check() error {
	if len(cs) == 0 || len(cs) > MaxClasses {
		return fmt.Errorf("want 1 to %d class names, got %d", MaxClasses, len(cs))
	}
	for i, n := range cs {
		if !nameRE.MatchString(n) {
			return fmt.Errorf("class %q: want a name of [a-z][a-z0-9_-]*, at most 32 characters", n)
		}
		for _, prev := range cs[:i] {
			if prev == n {
				return fmt.Errorf("class %q is listed twice", n)
			}
		}
	}
	return nil
}

// Queued is one queued request as Pick sees it.
type Queued struct {
	Class   Class
	Arrived time.Time
	Client  string // the API key's name
}

// Pick is the index of the request to admit next among n queued ones, in
// arrival order (at(i) is the i-th): the highest class once aged (see
// Aged) goes first; within it, the oldest or, under fair share, the
// oldest of the client whose turn it is. Clients take turns in the order
// of their names, each after turn (the client admitted last), so one
// client's burst waits its turn between the requests of the others.
func Pick(n int, at func(int) Queued, now time.Time, age time.Duration, fair bool, turn string) int {
	best := None
	for i := range n {
		q := at(i)
		if c := q.Class.Aged(now.Sub(q.Arrived), age); i == 0 || c.Above(best) {
			best = c
		}
	}
	after, first := -1, -1
	var afterClient, firstClient string
	for i := range n {
		q := at(i)
		if q.Class.Aged(now.Sub(q.Arrived), age) != best {
			continue
		}
		if !fair {
			return i
		}
		if q.Client > turn && (after < 0 || q.Client < afterClient) {
			after, afterClient = i, q.Client
		}
		if first < 0 || q.Client < firstClient {
			first, firstClient = i, q.Client
		}
	}
	if after >= 0 {
		return after
	}
	return first // every client of the class comes before the last one: a new round
}

// Oldest is, by class, when a model's oldest queued request of that class
// arrived (zero: none of it queued); class c is at index c-1.
type Oldest [MaxClasses]time.Time

// Note records a queued request of class c that arrived at at.
func (o *Oldest) Note(c Class, at time.Time) {
	if !c.Set() || int(c) > MaxClasses {
		return
	}
	if i := int(c) - 1; o[i].IsZero() || at.Before(o[i]) {
		o[i] = at
	}
}

// Best is the highest class among the queued requests once aged at now
// (see Aged), and when the oldest of those that count as that class
// arrived; None when nothing is queued.
func (o *Oldest) Best(now time.Time, age time.Duration) (Class, time.Time) {
	best, since := None, time.Time{}
	for i, at := range o {
		if at.IsZero() {
			continue
		}
		c := Class(i+1).Aged(now.Sub(at), age)
		if c.Above(best) || (c == best && at.Before(since)) {
			best, since = c, at
		}
	}
	return best, since
}
