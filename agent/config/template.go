package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// The keys of a model or template that shape its other keys rather than
// configure the engine: the template it takes and its variables.
const (
	templateKey = "template"
	varsKey     = "vars"
)

// withMeta is schema with the template and vars keys, which withTemplates
// and substitute have consumed already.
func withMeta(schema map[string]setter) map[string]setter {
	out := maps.Clone(schema)
	consumed := setter{set: func(any) error { return nil }, get: func() any { return nil }}
	out[templateKey], out[varsKey] = consumed, consumed
	return out
}

// checkTemplates checks every template on its own, once: its keys and
// their values (before substitution), its vars, and the template it names.
func (d *decoder) checkTemplates() {
	for _, name := range slices.Sorted(maps.Keys(d.tmpls)) {
		t := d.tmpls[name]
		var m Model
		pol := d.cfg.Policy
		d.fields(t, withMeta(modelSchema(&m, &pol)))
		d.vars(t)
		if !t.has(templateKey) {
			continue
		}
		parent, ok := d.parent(t)
		if !ok {
			continue
		}
		// A cycle is reported once, at the first of its templates by name.
		path := []string{name}
		for p := parent; p != nil; {
			pn := p.path[len(p.path)-1]
			if i := slices.Index(path, pn); i >= 0 {
				if i == 0 && name == slices.Min(path) {
					d.addAt(t.at(templateKey), fmt.Sprintf("templates %s name each other: a cycle", strings.Join(append(path, pn), " -> ")))
				}
				break
			}
			path = append(path, pn)
			if !p.has(templateKey) {
				break
			}
			if p, ok = d.parent(p); !ok {
				break
			}
		}
	}
}

// parent is the template t's template key names; false when it names none
// that exists (reported here) or is not a string.
func (d *decoder) parent(t *table) (*table, bool) {
	e := t.at(templateKey)
	name, ok := e.raw.(string)
	if !ok {
		d.addAt(e, wantType("a template name (a string)", e.raw).Error())
		return nil, false
	}
	p := d.tmpls[name]
	if p == nil {
		known := slices.Sorted(maps.Keys(d.tmpls))
		if len(known) == 0 {
			d.addAt(e, fmt.Sprintf("unknown template %q: no [templates.*] is defined", name))
		} else {
			d.addAt(e, fmt.Sprintf("unknown template %q (defined: %s)", name, strings.Join(known, ", ")))
		}
		return nil, false
	}
	return p, true
}

// chain is the templates a model's own table takes, nearest first: the one
// it names, the one that names, and so on; it stops at a cycle (reported by
// checkTemplates) or an unknown name.
func (d *decoder) chain(own *table) []*table {
	var chain []*table
	for t := own; t.has(templateKey); {
		p, ok := d.parent(t)
		if !ok || slices.Contains(chain, p) {
			break
		}
		chain = append(chain, p)
		t = p
	}
	return chain
}

// withTemplates is the model's table with the keys of its templates: each
// key the model sets replaces the template's, a nearer template's a
// farther one's. The entries keep where they were written. The template
// names are returned nearest first, and the vars merged name by name.
func (d *decoder) withTemplates(own *table) (*table, []string, map[string]varDef) {
	chain := d.chain(own)
	merged := &table{file: own.file, path: own.path, line: own.line, keys: map[string]entry{}}
	vars := map[string]varDef{}
	names := make([]string, len(chain))
	for i, t := range chain {
		names[i] = t.path[len(t.path)-1]
	}
	apply := func(t *table, tmpl string) {
		for k, e := range t.keys {
			if k == templateKey && tmpl != "" {
				continue
			}
			e.tmpl = tmpl
			merged.keys[k] = e
		}
		maps.Copy(vars, d.vars(t))
	}
	for i := len(chain) - 1; i >= 0; i-- {
		apply(chain[i], names[i])
	}
	apply(own, "")
	return merged, names, vars
}

// varDef is one variable of a vars table: its value and where it was set.
type varDef struct {
	value string
	at    entry
}

// vars decodes t's vars table, reporting what is wrong with it.
func (d *decoder) vars(t *table) map[string]varDef {
	e, ok := t.keys[varsKey]
	if !ok {
		return nil
	}
	tbl, ok := e.raw.(map[string]any)
	if !ok {
		d.addAt(e, wantType("a table of strings", e.raw).Error())
		return nil
	}
	out := map[string]varDef{}
	for _, k := range slices.Sorted(maps.Keys(tbl)) {
		at := e
		at.path = child(toml.Key(slices.Clone(e.path)), k)
		s, isString := tbl[k].(string)
		switch {
		case !envNameRE.MatchString(k):
			d.addAt(at, fmt.Sprintf("%q is not a variable name (want letters, digits and _, not starting with a digit)", k))
		case slices.Contains(builtinVars, k):
			d.addAt(at, fmt.Sprintf("${%s} is napd's own variable: choose another name", k))
		case !isString:
			d.addAt(at, wantType("a string", tbl[k]).Error())
		default:
			out[k] = varDef{s, at}
		}
	}
	return out
}
