package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Substitutions: ${NAME} in the strings of the keys listed in substituted.
// ${MODEL}, ${SERVED_NAME}, ${env:NAME} and the vars of a model and its
// templates are replaced when the file is loaded; ${PORT} and ${GPUS} are
// kept, and replaced when the engine starts (the port and the GPUs may be
// chosen then). "$${" is a literal "${". Any other name is an error.

// substituted are the model keys whose strings take substitutions.
var substituted = []string{"command", "environment", "volumes", "image", "container_args"}

// napd's own variables.
const (
	varPort       = "PORT"        // the engine's port, at start
	varGPUs       = "GPUS"        // its GPUs, comma-separated, at start
	varModel      = "MODEL"       // the model's name
	varServedName = "SERVED_NAME" // served_name, else the model's name
)

var builtinVars = []string{varPort, varGPUs, varModel, varServedName}

// scan writes s with every ${NAME} replaced by what f returns for NAME.
// "$${" stays "$${", or becomes "${" when unescape is set.
func scan(s string, unescape bool, f func(name string) (string, error)) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		if i > 0 && s[i-1] == '$' {
			b.WriteString(s[:i-1])
			if unescape {
				b.WriteString("${")
			} else {
				b.WriteString("$${")
			}
			s = s[i+2:]
			continue
		}
		j := strings.IndexByte(s[i+2:], '}')
		if j < 0 {
			return "", errors.New(`"${" without its closing "}" (write "$${" for a literal "${")`)
		}
		repl, err := f(s[i+2 : i+2+j])
		if err != nil {
			return "", err
		}
		b.WriteString(s[:i])
		b.WriteString(repl)
		s = s[i+3+j:]
	}
}

// keep leaves a ${NAME} as it is.
func keep(name string) string { return "${" + name + "}" }

// mentions reports whether s holds ${name}.
func mentions(s, name string) bool {
	found := false
	_, _ = scan(s, false, func(n string) (string, error) {
		found = found || n == name
		return keep(n), nil
	})
	return found
}

// mentions reports whether the model's command or environment holds
// ${name}.
func (m *Model) mentions(name string) bool {
	return slices.ContainsFunc(m.Command, func(s string) bool { return mentions(s, name) }) ||
		slices.ContainsFunc(slices.Collect(maps.Values(m.Environment)), func(s string) bool { return mentions(s, name) })
}

// replace returns s with ${name} replaced by value, everything else kept
// (unescape: "$${" turned into "${").
func replace(s, name, value string, unescape bool) string {
	out, err := scan(s, unescape, func(n string) (string, error) {
		if n == name {
			return value, nil
		}
		return keep(n), nil
	})
	if err != nil {
		return s // not from a loaded config: loading refuses it
	}
	return out
}

// expandAll applies f to each string of command and env, into new ones.
func expandAll(command []string, env map[string]string, f func(string) string) ([]string, map[string]string) {
	var cmd []string
	if command != nil {
		cmd = make([]string, len(command))
		for i, s := range command {
			cmd[i] = f(s)
		}
	}
	var out map[string]string
	if env != nil {
		out = make(map[string]string, len(env))
		for k, v := range env {
			out[k] = f(v)
		}
	}
	return cmd, out
}

// ExpandPort returns the model's command and environment with every
// ${PORT} replaced by port; ${GPUS} is left for ExpandGPUs. The model
// itself is left unchanged (a model with port = 0 gets a new port at each
// start).
func (m *Model) ExpandPort(port int) (command []string, env map[string]string) {
	p := strconv.Itoa(port)
	return expandAll(m.Command, m.Environment, func(s string) string { return replace(s, varPort, p, false) })
}

// ExpandPortIn is ExpandPort for a model's other strings that take
// substitutions (a container's image, volumes and arguments).
func ExpandPortIn(ss []string, port int) []string {
	p := strconv.Itoa(port)
	out, _ := expandAll(ss, nil, func(s string) string { return replace(s, varPort, p, false) })
	return out
}

// ExpandGPUsIn is ExpandGPUs for a model's other strings.
func ExpandGPUsIn(ss []string, gpus []int) []string {
	out, _ := ExpandGPUs(ss, nil, gpus)
	return out
}

// ExpandGPUs is the last expansion before an engine starts, once its GPUs
// are known: every ${GPUS} in command and env becomes the GPU indexes,
// comma-separated as in CUDA_VISIBLE_DEVICES ("" for none), and every
// "$${" a literal "${".
func ExpandGPUs(command []string, env map[string]string, gpus []int) ([]string, map[string]string) {
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = strconv.Itoa(g)
	}
	list := strings.Join(ids, ",")
	return expandAll(command, env, func(s string) string { return replace(s, varGPUs, list, true) })
}

// resolver replaces the substitutions known at load for one model.
type resolver struct {
	model, served string
	vars          map[string]varDef
	getenv        func(string) (string, bool)
	done          map[string]string // vars expanded so far
	active        []string          // vars being expanded, to find a cycle
}

func (r *resolver) expand(s string) (string, error) { return scan(s, false, r.lookup) }

func (r *resolver) lookup(name string) (string, error) {
	switch name {
	case varPort, varGPUs:
		return keep(name), nil // replaced when the engine starts
	case varModel:
		return r.model, nil
	case varServedName:
		return r.served, nil
	}
	if spec, ok := strings.CutPrefix(name, "env:"); ok {
		return r.env(spec)
	}
	v, ok := r.vars[name]
	if !ok {
		known := "${PORT}, ${GPUS}, ${MODEL}, ${SERVED_NAME}, ${env:NAME}"
		if len(r.vars) > 0 {
			known += " and the vars " + strings.Join(slices.Sorted(maps.Keys(r.vars)), ", ")
		}
		return "", fmt.Errorf("unknown variable ${%s} (known: %s; write $${ for a literal ${)", name, known)
	}
	if s, ok := r.done[name]; ok {
		return s, nil
	}
	if i := slices.Index(r.active, name); i >= 0 {
		return "", fmt.Errorf("vars %s refer to each other: a cycle", strings.Join(append(slices.Clone(r.active[i:]), name), " -> "))
	}
	r.active = append(r.active, name)
	s, err := r.expand(v.value)
	r.active = r.active[:len(r.active)-1]
	if err != nil {
		return "", fmt.Errorf("var %s (%s:%d): %w", name, v.at.file, v.at.line, err)
	}
	r.done[name] = s
	return s, nil
}

// env is ${env:NAME} or ${env:NAME:-DEFAULT}: napd's environment, the
// default when NAME is unset or empty (as in the shell).
func (r *resolver) env(spec string) (string, error) {
	name, def, hasDef := strings.Cut(spec, ":-")
	if !envNameRE.MatchString(name) {
		return "", fmt.Errorf("${env:%s}: %q is not an environment variable name", spec, name)
	}
	v, ok := r.getenv(name)
	switch {
	case ok && (v != "" || !hasDef):
		return v, nil
	case hasDef:
		return def, nil
	}
	return "", fmt.Errorf("${env:%s}: %s is not set in napd's environment (${env:%s:-DEFAULT} gives a default)", spec, name, name)
}

// substitute replaces the load-time substitutions in the keys of the
// model's merged table that take them.
func (d *decoder) substitute(t *table, model string, vars map[string]varDef) {
	served := model
	if s, ok := t.keys["served_name"].raw.(string); ok {
		served = s
	}
	r := &resolver{model: model, served: served, vars: vars, getenv: d.getenv, done: map[string]string{}}
	for _, k := range substituted {
		e, ok := t.keys[k]
		if !ok {
			continue
		}
		raw, err := substituteValue(e.raw, r.expand)
		if err != nil {
			if e.tmpl != "" {
				err = fmt.Errorf("in model %s: %w", model, err)
			}
			d.addAt(e, err.Error())
			continue
		}
		e.raw = raw
		t.keys[k] = e
	}
}

// substituteValue applies f to a string, the strings of an array, or the
// string values of a table, into a new value (a template's is shared by
// every model that takes it). Other values are left to the key's setter.
func substituteValue(raw any, f func(string) (string, error)) (any, error) {
	switch v := raw.(type) {
	case string:
		return f(v)
	case []any:
		out := slices.Clone(v)
		for i, el := range v {
			if s, ok := el.(string); ok {
				x, err := f(s)
				if err != nil {
					return nil, fmt.Errorf("element %d: %w", i, err)
				}
				out[i] = x
			}
		}
		return out, nil
	case map[string]any:
		out := maps.Clone(v)
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if s, ok := v[k].(string); ok {
				x, err := f(s)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", k, err)
				}
				out[k] = x
			}
		}
		return out, nil
	}
	return raw, nil
}
