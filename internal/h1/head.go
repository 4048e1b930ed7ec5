package h1

import (
	"net/http"
	"net/textproto"
)

// Head is an answer's header as a list of fields in the order they came,
// for a proxy that passes an engine's answer on: RoundTripHead reads it
// instead of an http.Header, and the Server writes it out as it is
// (TakeHead). An http.Header costs a map, made field by field, looked up
// and edited through hashing, then walked to be written out again: about
// a tenth of the proxy's own work per request (docs/bench.md). A head
// has a handful of fields, which a scan finds sooner than a hash.
//
// Names are in canonical form (as http.Header's keys): those read from
// an answer are made so, and Set and Add make theirs so. A value is
// shared with the head it came in, as http.Header's values are.
type Head struct {
	// names and values are the fields, one value each; a removed field
	// keeps its place with an empty name.
	names, values []string
	// live counts the fields not removed.
	live int
}

// init makes h the fields of the n lines of s, which checkFields
// accepted, checking their values as buildFields does; names and values
// are pieces of s, kept in the room given when it holds them.
func (h *Head) init(s string, n int, names, values []string) error {
	if n > cap(names) {
		names, values = make([]string, 0, n), make([]string, 0, n)
	}
	h.names, h.values = names[:0], values[:0]
	for {
		var line string
		line, s = nextLine(s)
		if line == "" {
			h.live = len(h.names)
			return nil
		}
		k, v := cutField(line)
		if !validValue(v) {
			return malformedLine(line)
		}
		h.names = append(h.names, k)
		h.values = append(h.values, v)
	}
}

// Len is the number of fields.
func (h *Head) Len() int { return h.live }

// Get is the first value of the field named k, "" when there is none.
func (h *Head) Get(k string) string {
	for i, n := range h.names {
		if n == k {
			return h.values[i]
		}
	}
	return ""
}

// Has reports whether the head has a field named k.
func (h *Head) Has(k string) bool {
	for _, n := range h.names {
		if n == k {
			return true
		}
	}
	return false
}

// Values are the values of the fields named k, in order: a piece of the
// head's own list when there is one (most fields), not to be changed.
func (h *Head) Values(k string) []string {
	var vv []string
	for i, n := range h.names {
		if n != k {
			continue
		}
		if vv == nil {
			vv = h.values[i : i+1 : i+1]
		} else {
			vv = append(vv, h.values[i])
		}
	}
	return vv
}

// Del removes every field named k.
func (h *Head) Del(k string) {
	h.DelFunc(func(n string) bool { return n == k })
}

// DelFunc removes every field whose name drop reports.
func (h *Head) DelFunc(drop func(name string) bool) {
	for i, n := range h.names {
		if n != "" && drop(n) {
			h.names[i] = ""
			h.live--
		}
	}
}

// Add adds a field named k (made canonical) with the value v.
func (h *Head) Add(k, v string) {
	h.names = append(h.names, textproto.CanonicalMIMEHeaderKey(k))
	h.values = append(h.values, v)
	h.live++
}

// Set replaces the fields named k (made canonical) with one of value v.
func (h *Head) Set(k, v string) {
	k = textproto.CanonicalMIMEHeaderKey(k)
	h.Del(k)
	h.Add(k, v)
}

// each calls field with each field's name and value (as a list of one),
// in the order the fields came.
func (h *Head) each(field func(k string, vs []string)) {
	for i, n := range h.names {
		if n != "" {
			field(n, h.values[i:i+1:i+1])
		}
	}
}

// Header is an http.Header of the same fields, for what needs one.
func (h *Head) Header() http.Header {
	m := make(http.Header, h.live)
	h.each(func(k string, vs []string) { m[k] = append(m[k], vs...) })
	return m
}

// HeaderFields is an http.Header read and changed through a Head's
// methods, for code that handles either: names are canonical (Set and Add
// make theirs so).
type HeaderFields http.Header

// Get is the first value of k, "" when there is none.
func (h HeaderFields) Get(k string) string {
	if vv := h[k]; len(vv) > 0 {
		return vv[0]
	}
	return ""
}

// Values are k's values.
func (h HeaderFields) Values(k string) []string { return h[k] }

// Del removes k.
func (h HeaderFields) Del(k string) { delete(h, k) }

// DelFunc removes every name drop reports.
func (h HeaderFields) DelFunc(drop func(name string) bool) {
	for k := range h {
		if drop(k) {
			delete(h, k)
		}
	}
}

// Set makes v the one value of k.
func (h HeaderFields) Set(k, v string) { http.Header(h).Set(k, v) }

// Add adds v to k's values.
func (h HeaderFields) Add(k, v string) { http.Header(h).Add(k, v) }
