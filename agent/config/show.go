package config

import (
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// Setting is one key of the effective configuration: its value after
// templates and substitutions, as TOML writes it, and where it came from.
type Setting struct {
	Key    string
	Value  any
	Source string // "FILE:LINE", "FILE:LINE (template T)", "FILE:LINE ([policy])" or "default"
}

// sourceDefault is the source of a value no file sets.
const sourceDefault = "default"

// shownTable is one table of the effective configuration.
type shownTable struct {
	path      toml.Key
	templates []string // a model's templates, nearest first
	settings  []Setting
}

// record keeps the effective value and source of every key of schema for
// t, after t was decoded with it.
func (d *decoder) record(t *table, schema map[string]setter, templates []string) {
	st := shownTable{path: t.path, templates: templates}
	isModel := t.path[0] == "models"
	policy := d.tables["policy"]
	for _, k := range slices.Sorted(maps.Keys(schema)) {
		src := sourceDefault
		if e, ok := t.keys[k]; ok {
			src = fmt.Sprintf("%s:%d", e.file, e.line)
			if e.tmpl != "" {
				src += " (template " + e.tmpl + ")"
			}
		} else if isModel && policy != nil && policy.has(k) {
			e := policy.keys[k]
			src = fmt.Sprintf("%s:%d ([policy])", e.file, e.line)
		}
		st.settings = append(st.settings, Setting{Key: k, Value: schema[k].get(), Source: src})
	}
	d.cfg.shown = append(d.cfg.shown, st)
}

// Settings returns the effective settings of a table: "agent", "gateway",
// "policy", "pressure" or "models.NAME"; nil when there is none.
func (c *Config) Settings(table string) []Setting {
	for _, st := range c.shown {
		if st.path.String() == table || strings.Join(st.path, ".") == table {
			return st.settings
		}
	}
	return nil
}

// Show writes the effective configuration as TOML, each value followed by
// its source: every table, or only the model named (by name or alias)
// when model is not "".
func (c *Config) Show(w io.Writer, model string) error {
	var name string
	if model != "" {
		m := c.Model(model)
		if m == nil {
			return fmt.Errorf("no model or alias %q in %s", model, c.describeFiles())
		}
		name = m.Name
	}
	fmt.Fprintf(w, "# The effective configuration of %s, after templates and\n"+
		"# substitutions. After each value: where it was set. Defaults are commented out.\n", c.describeFiles())
	for _, st := range c.shown {
		if name != "" && (st.path[0] != "models" || st.path[1] != name) {
			continue
		}
		fmt.Fprintf(w, "\n[%s]\n", st.path)
		if len(st.templates) > 0 {
			fmt.Fprintf(w, "# template: %s\n", strings.Join(st.templates, " <- "))
		}
		for _, s := range st.settings {
			comment := ""
			if s.Source == sourceDefault {
				comment = "#"
			}
			fmt.Fprintf(w, "%s%s = %s  # %s\n", comment, FormatKey(s.Key), FormatTOML(s.Value), s.Source)
		}
	}
	return nil
}

// Model is the model named name or having it as an alias; nil when none.
func (c *Config) Model(name string) *Model {
	for _, m := range c.Models {
		if m.Name == name || slices.Contains(m.Aliases, name) {
			return m
		}
	}
	return nil
}

// Summary is what `napd --check` says of a valid configuration: "3
// models", with ", 2 drop-ins" when it read some.
func (c *Config) Summary() string {
	s := fmt.Sprintf("%d models", len(c.Models))
	if n := len(c.DropIns); n > 0 {
		s += fmt.Sprintf(", %d drop-ins", n)
	}
	return s
}

// describeFiles names the main file and how many drop-ins were read.
func (c *Config) describeFiles() string {
	switch len(c.DropIns) {
	case 0:
		return c.Path
	case 1:
		return c.Path + " and " + c.DropIns[0]
	}
	return fmt.Sprintf("%s and %d drop-ins in %s", c.Path, len(c.DropIns), filepath.Dir(c.DropIns[0]))
}
