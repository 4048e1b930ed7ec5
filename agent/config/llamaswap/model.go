package llamaswap

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/napd/napd/agent/config"
)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// model converts one llama-swap model to napd's [models.NAME] table, its
// keys in the order llama-swap's were, with what has no napd key as a
// comment where it was. A model napd cannot serve (its proxy is elsewhere)
// is a comment, not Converted.
func (c *conv) model(name string, p pair, taken map[string]bool) (Model, error) {
	id := p.key
	what := "models." + id
	pairs, err := c.mapping(p.v, what)
	if err != nil {
		return Model{}, err
	}
	get := func(key string) (pair, bool) {
		i := slices.IndexFunc(pairs, func(q pair) bool { return q.key == key })
		if i < 0 {
			return pair{}, false
		}
		return pairs[i], true
	}
	mac := macros{global: c.global, id: id}
	if mp, ok := get("macros"); ok {
		if mac.own, err = c.macroTable(mp.v, what+".macros"); err != nil {
			return Model{}, err
		}
	}
	text := func(q pair) (string, error) {
		s, err := c.scalar(q.v, what+"."+q.key)
		if err != nil {
			return "", err
		}
		if s, err = mac.expand(s); err != nil {
			return "", fail(q.v, "%s.%s: %v", what, q.key, err)
		}
		return s, nil
	}
	cmdPair, ok := get("cmd")
	if !ok {
		return Model{}, fail(p.kn, "%s: no cmd: every llama-swap model has one", what)
	}
	argv, err := c.argv(cmdPair, text, what)
	if err != nil {
		return Model{}, err
	}
	ctr := parseRun(argv)

	m := Model{Name: name, ID: id, Converted: true}
	var s section
	var aliases []string
	if name != id && validAlias(id) && !taken[id] {
		aliases = append(aliases, id)
	}
	env, err := c.env(get, text, ctr)
	if err != nil {
		return Model{}, err
	}
	envDone, aliasesDone := len(env) == 0, false
	writeAliases := func() {
		if !aliasesDone && len(aliases) > 0 {
			why := ""
			if name != id {
				why = fmt.Sprintf("%q, llama-swap's name, is what clients send", id)
			}
			s.set("aliases", aliases, why)
		}
		aliasesDone = true
	}
	if _, ok := get("aliases"); !ok {
		writeAliases()
	}
	wakeProgress := c.wakeProgress
	for _, q := range pairs {
		switch q.key {
		case "cmd":
			if ctr != nil {
				c.containerKeys(&s, ctr)
				if !envDone {
					s.set("environment", env, "env and the run line's --env")
					envDone = true
				}
			} else {
				s.set("command", argv, "cmd")
			}
		case "cmdStop":
			stop, err := c.argv(q, text, what)
			if err != nil {
				return Model{}, err
			}
			if ctr != nil && ctr.stops(stop) {
				c.converted("%s.cmdStop: napd stops the %s container itself", what, ctr.runtime)
				continue
			}
			s.comment("cmdStop: dropped: " + noStop + ".")
			c.dropped("%s.cmdStop: %s", what, noStop)
		case "proxy":
			proxy, err := text(q)
			if err != nil {
				return Model{}, err
			}
			port, why := proxyPort(proxy)
			if port < 0 {
				c.dropped("%s: not converted: its proxy %s: %s", what, proxy, why)
				var note section
				note.comment(fmt.Sprintf("[models.%s] (llama-swap's %q) is not converted: its proxy %s: %s.", name, id, proxy, why))
				return Model{Name: name, ID: id, TOML: strings.Join(note.lines, "\n") + "\n"}, nil
			}
			switch {
			case port > 0 && ctr != nil && ctr.hostPort == 0:
				s.set("port", port, "proxy")
			case port > 0 && ctr == nil:
				s.set("port", port, "proxy")
			}
		case "checkEndpoint":
			path, err := text(q)
			if err != nil {
				return Model{}, err
			}
			if strings.EqualFold(path, "none") {
				s.comment("checkEndpoint: none: dropped: " + noCheckNone + " (default \"/health\").")
				c.dropped("%s.checkEndpoint none: %s", what, noCheckNone)
				continue
			}
			if !strings.HasPrefix(path, "/") {
				path = "/" + path
			}
			s.set("health", path, "checkEndpoint")
		case "ttl":
			n, err := c.integer(q.v, what+".ttl")
			if err != nil {
				return Model{}, err
			}
			if n > 0 {
				s.set("idle_timeout", seconds(n), "ttl")
			}
		case "unloadTimeout":
			n, err := c.integer(q.v, what+".unloadTimeout")
			if err != nil {
				return Model{}, err
			}
			if n > 0 {
				s.set("stop_timeout", seconds(n), "unloadTimeout: the grace before the engine is killed")
			}
		case "aliases":
			list, err := c.strings(q.v, what+".aliases")
			if err != nil {
				return Model{}, err
			}
			for _, a := range list {
				switch {
				case !validAlias(a):
					s.comment(fmt.Sprintf("alias %q: dropped: napd's aliases hold no spaces or control characters.", a))
					c.dropped("%s alias %q: holds a space", what, a)
				case taken[a] || slices.Contains(aliases, a):
					s.comment(fmt.Sprintf("alias %q: dropped: it is a model's name or listed twice.", a))
					c.dropped("%s alias %q: a model's name", what, a)
				default:
					aliases = append(aliases, a)
				}
			}
			writeAliases()
		case "env":
			if !envDone {
				s.set("environment", env, "env")
				envDone = true
			}
		case "useModelName":
			served, err := text(q)
			if err != nil {
				return Model{}, err
			}
			s.set("served_name", served, "useModelName")
		case "concurrencyLimit":
			n, err := c.integer(q.v, what+".concurrencyLimit")
			if err != nil {
				return Model{}, err
			}
			if n > 0 {
				s.set("max_concurrency", n, "concurrencyLimit; beyond it napd queues (queue = 128) where llama-swap answered 429")
			}
		case "sendLoadingState":
			if wakeProgress, err = c.boolean(q.v, what+".sendLoadingState"); err != nil {
				return Model{}, err
			}
		case "unlisted":
			if v, err := c.boolean(q.v, what+".unlisted"); err != nil {
				return Model{}, err
			} else if v {
				s.set("listed", false, "unlisted")
			}
		case "filters":
			s.comment("filters: dropped: " + noFilters + ".")
			c.dropped("%s.filters: %s", what, noFilters)
		case "name", "description":
			v, _ := c.scalar(q.v, what+"."+q.key)
			s.comment(fmt.Sprintf("%s: %q: dropped: %s.", q.key, v, noShown))
			c.dropped("%s.%s: %s", what, q.key, noShown)
		case "metadata":
			s.comment("metadata: dropped: " + noShown + ".")
			c.dropped("%s.metadata: %s", what, noShown)
		case "macros":
		default:
			s.comment(q.key + ": dropped: not a llama-swap model setting this importer knows.")
			c.dropped("%s.%s: unknown to the importer", what, q.key)
		}
	}
	if wakeProgress {
		s.set("wake_progress", true, "sendLoadingState")
	}
	if c.preload[id] || slices.ContainsFunc(aliases, func(a string) bool { return c.preload[a] }) {
		s.set("warm_on_start", true, "hooks.on_startup.preload")
	}
	var b strings.Builder
	b.WriteString("[models." + config.FormatKey(name) + "]\n")
	for _, l := range s.lines {
		b.WriteString(l + "\n")
	}
	m.TOML = b.String()
	return m, nil
}

// argv is a cmd or cmdStop, macros expanded, split into words.
func (c *conv) argv(q pair, text func(pair) (string, error), what string) ([]string, error) {
	s, err := text(q)
	if err != nil {
		return nil, err
	}
	argv, line, err := splitCommand(s)
	if err != nil {
		n, _ := c.deref(q.v)
		at := n.Line + line - 1
		if n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
			at++ // a block scalar's text starts below its indicator
		}
		return nil, &Error{Line: at, Msg: fmt.Sprintf("%s.%s: %v", what, q.key, err)}
	}
	if len(argv) == 0 {
		return nil, fail(q.v, "%s.%s: empty", what, q.key)
	}
	return argv, nil
}

// env is a model's environment: its env list ("NAME=value"), then the
// container's --env options.
func (c *conv) env(get func(string) (pair, bool), text func(pair) (string, error), ctr *container) (map[string]string, error) {
	out := map[string]string{}
	if q, ok := get("env"); ok {
		list, err := c.strings(q.v, "env")
		if err != nil {
			return nil, err
		}
		for _, kv := range list {
			expanded, err := text(pair{key: "env", v: &yaml.Node{Kind: yaml.ScalarNode, Value: kv, Line: q.v.Line}})
			if err != nil {
				return nil, err
			}
			k, v, ok := strings.Cut(expanded, "=")
			if !ok || !envNameRE.MatchString(k) {
				return nil, fail(q.v, "env: %q is not NAME=value", kv)
			}
			out[k] = v
		}
	}
	if ctr != nil {
		for _, kv := range ctr.env {
			if !envNameRE.MatchString(kv[0]) {
				return nil, fmt.Errorf("--env %s: not a variable name", kv[0])
			}
			out[kv[0]] = kv[1]
		}
	}
	return out, nil
}

// containerKeys writes a container model's keys: the names are those of
// napd's container engines (docs/supervisor.md).
func (c *conv) containerKeys(s *section, ctr *container) {
	s.set("image", ctr.image, "cmd: "+ctr.runtime+" run")
	s.set("container_runtime", ctr.runtime, "")
	if len(ctr.command) > 0 {
		s.set("command", ctr.command, "the container's command, after the image")
	}
	if len(ctr.volumes) > 0 {
		s.set("volumes", ctr.volumes, "--volume")
	}
	if len(ctr.args) > 0 {
		s.set("container_args", ctr.args, "the run line's other options")
	}
	if ctr.containerPort > 0 {
		s.set("container_port", ctr.containerPort, "--publish: the engine's port in the container")
		if ctr.hostPort > 0 {
			s.set("port", ctr.hostPort, "--publish: the host's port")
		}
	}
	if ctr.pull != "" {
		s.set("pull", ctr.pull, "--pull")
	}
	c.converted("cmd: %s run -> a container model (image %s)", ctr.runtime, ctr.image)
}
