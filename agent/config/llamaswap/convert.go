// Package llamaswap converts a llama-swap configuration (its YAML file) to
// napd's TOML: what `napctl import llama-swap` prints. It maps every key
// llama-swap documents (v250's config.example.yaml) to napd's equivalent,
// or writes it as a comment saying what napd does instead.
//
// It only reads and writes text: it starts nothing and touches no file.
package llamaswap

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Options of a conversion.
type Options struct {
	// File is the YAML file's name, for messages.
	File string
	// KeysFile is the absolute path of the api_keys_file the config's
	// apiKeys are written to (by the caller: see Result.Keys). A config
	// with apiKeys and no KeysFile is an error: napd would serve without
	// the keys llama-swap required.
	KeysFile string
}

// Result is a converted configuration.
type Result struct {
	// Host is the main file's part: [agent], [gateway] and [policy], and
	// comments for what has no place in a model.
	Host string
	// Models are the [models.NAME] tables, in the file's order.
	Models []Model
	// Keys is the api_keys_file's content ("name:key" lines); "" when the
	// config has no apiKeys.
	Keys string
	// Converted and Dropped summarise the conversion, one line each.
	Converted, Dropped []string
}

// Model is one converted model.
type Model struct {
	Name string // napd's name
	ID   string // llama-swap's
	// TOML is its [models.NAME] table, or, when not Converted, a comment
	// saying why napd cannot serve it.
	TOML      string
	Converted bool
}

// Main is the whole configuration as one file: Host, then every model.
func (r *Result) Main() string {
	var b strings.Builder
	b.WriteString(r.Host)
	for _, m := range r.Models {
		b.WriteString("\n")
		b.WriteString(m.TOML)
	}
	return b.String()
}

// Error is a problem in the input that stops the conversion.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// maxNodes bounds the YAML nodes a conversion visits, aliases expanded:
// a file of anchors that refer to each other must not make it run forever.
const maxNodes = 1 << 20

// Convert converts data, a llama-swap configuration.
func Convert(data []byte, opts Options) (*Result, error) {
	c := &conv{opts: opts, res: &Result{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := err.Error()
		line := 0
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = msg[len(m[0]):]
		}
		return nil, &Error{opts.File, line, "not YAML: " + strings.TrimPrefix(msg, "yaml: ")}
	}
	if err := c.convert(&doc); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.File = opts.File
		}
		return nil, err
	}
	return c.res, nil
}

// conv is one conversion.
type conv struct {
	opts   Options
	res    *Result
	nodes  int
	global map[string]string // the file's macros
	// Settings that reach every model.
	wakeProgress bool
	preload      map[string]bool // model ids and aliases to warm at start
}

func fail(n *yaml.Node, format string, args ...any) error {
	return &Error{Line: n.Line, Msg: fmt.Sprintf(format, args...)}
}

// pair is one key of a mapping.
type pair struct {
	key   string
	kn, v *yaml.Node
}

// deref follows YAML aliases (*name) to their anchors.
func (c *conv) deref(n *yaml.Node) (*yaml.Node, error) {
	for n.Kind == yaml.AliasNode {
		if c.nodes++; c.nodes > maxNodes || n.Alias == nil {
			return nil, fail(n, "too many YAML aliases")
		}
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		return c.deref(n.Content[0])
	}
	return n, nil
}

// mapping is n's keys in order, with YAML merge keys (<<: *anchor) applied.
func (c *conv) mapping(n *yaml.Node, what string) ([]pair, error) {
	n, err := c.deref(n)
	if err != nil {
		return nil, err
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fail(n, "%s: want a mapping", what)
	}
	var out []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		if c.nodes++; c.nodes > maxNodes {
			return nil, fail(n, "too many YAML nodes")
		}
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "<<" && k.Tag == "!!merge" {
			merged, err := c.mapping(v, what)
			if err != nil {
				return nil, err
			}
			for _, p := range merged {
				if !slices.ContainsFunc(out, func(q pair) bool { return q.key == p.key }) {
					out = append(out, p)
				}
			}
			continue
		}
		out = slices.DeleteFunc(out, func(q pair) bool { return q.key == k.Value })
		out = append(out, pair{k.Value, k, v})
	}
	return out, nil
}

// scalar is n's text: a string, number or boolean.
func (c *conv) scalar(n *yaml.Node, what string) (string, error) {
	n, err := c.deref(n)
	if err != nil {
		return "", err
	}
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", fail(n, "%s: want a value, not a list or a mapping", what)
	}
	return n.Value, nil
}

// strings is n as a list of scalars (a lone scalar is a list of one).
func (c *conv) strings(n *yaml.Node, what string) ([]string, error) {
	n, err := c.deref(n)
	if err != nil {
		return nil, err
	}
	if n.Kind == yaml.ScalarNode {
		if n.Tag == "!!null" {
			return nil, nil
		}
		return []string{n.Value}, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, fail(n, "%s: want a list", what)
	}
	var out []string
	for _, el := range n.Content {
		s, err := c.scalar(el, what)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

func (c *conv) integer(n *yaml.Node, what string) (int, error) {
	s, err := c.scalar(n, what)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, fail(n, "%s: want a whole number of at least 0, got %q", what, s)
	}
	return v, nil
}

func (c *conv) boolean(n *yaml.Node, what string) (bool, error) {
	s, err := c.scalar(n, what)
	if err != nil {
		return false, err
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, fail(n, "%s: want true or false, got %q", what, s)
	}
	return v, nil
}

func (c *conv) converted(format string, args ...any) {
	c.res.Converted = append(c.res.Converted, fmt.Sprintf(format, args...))
}

func (c *conv) dropped(format string, args ...any) {
	c.res.Dropped = append(c.res.Dropped, fmt.Sprintf(format, args...))
}

// seconds is a llama-swap count of seconds as a napd duration.
func seconds(n int) string {
	if n == 0 {
		return "0"
	}
	return strconv.Itoa(n) + "s"
}

// What napd does instead of the llama-swap settings it has no key for.
const (
	noGroups    = "napd has no groups: its room scheduling replaces their swap rules (a wake that does not fit in GPU memory first puts idle models on the same GPUs to sleep; see docs/scheduling.md); pinned = true keeps a model loaded"
	noPeers     = "napd proxies only the models it runs on this host; several napd hosts go behind a load balancer (docs/fleet.md)"
	noFilters   = "napd forwards request bodies unchanged but for the model name (served_name)"
	noPorts     = "napd picks the port of each model that uses ${PORT} itself, and remembers it (state_dir/ports.json)"
	noLogs      = "napd logs to the journal (journalctl -u napd)"
	noMetrics   = "napd keeps no metrics history: Prometheus scrapes [agent] metrics_listen"
	noShown     = "napd shows no model name, description or metadata in /v1/models"
	noStop      = "napd stops the engine itself: SIGTERM to its process group, SIGKILL after stop_timeout"
	noCheckNone = "napd verifies every wake on a health path; set health to a path the engine answers 200 on"
)

// convert converts the document.
func (c *conv) convert(doc *yaml.Node) error {
	if len(doc.Content) == 0 {
		return &Error{Line: 1, Msg: "empty: a llama-swap configuration has models"}
	}
	top, err := c.mapping(doc, "the configuration")
	if err != nil {
		return err
	}
	var models *yaml.Node
	var agent, gateway, policy, notes section
	c.preload = map[string]bool{}
	globalTTL := -1
	// First the settings models depend on.
	for _, p := range top {
		switch p.key {
		case "macros":
			if c.global, err = c.macroTable(p.v, "macros"); err != nil {
				return err
			}
			c.converted("macros: %d, expanded", len(c.global))
		case "sendLoadingState":
			if c.wakeProgress, err = c.boolean(p.v, p.key); err != nil {
				return err
			}
		case "hooks":
			if err := c.hooks(p.v, &notes); err != nil {
				return err
			}
		}
	}
	for _, p := range top {
		switch p.key {
		case "models":
			models = p.v
		case "macros", "hooks":
		case "healthCheckTimeout":
			n, err := c.integer(p.v, p.key)
			if err != nil {
				return err
			}
			policy.set("wake_timeout", seconds(max(n, 1)), "healthCheckTimeout: how long a start may take until the engine is healthy")
			c.converted("healthCheckTimeout -> [policy] wake_timeout")
		case "globalTTL":
			if globalTTL, err = c.integer(p.v, p.key); err != nil {
				return err
			}
		case "logLevel":
			lvl, err := c.scalar(p.v, p.key)
			if err != nil {
				return err
			}
			if !slices.Contains([]string{"debug", "info", "warn", "error"}, lvl) {
				return fail(p.v, "logLevel: unknown level %q (want debug, info, warn or error)", lvl)
			}
			agent.set("log_level", lvl, "logLevel")
			c.converted("logLevel -> [agent] log_level")
		case "includeAliasesInList":
			v, err := c.boolean(p.v, p.key)
			if err != nil {
				return err
			}
			gateway.set("list_aliases", v, "includeAliasesInList")
			c.converted("includeAliasesInList -> [gateway] list_aliases")
		case "sendLoadingState":
			c.converted("sendLoadingState -> wake_progress of each model (SSE comments while a model wakes, instead of loading text in reasoning_content)")
		case "apiKeys":
			keys, err := c.strings(p.v, p.key)
			if err != nil {
				return err
			}
			if err := c.apiKeys(p.v, keys, &gateway); err != nil {
				return err
			}
		case "startPort":
			notes.comment(fmt.Sprintf("startPort: %s: dropped: %s.", p.v.Value, noPorts))
			c.dropped("startPort: %s", noPorts)
		case "logTimeFormat", "logToStdout":
			notes.comment(fmt.Sprintf("%s: dropped: %s.", p.key, noLogs))
			c.dropped("%s: %s", p.key, noLogs)
		case "metricsMaxInMemory":
			notes.comment(fmt.Sprintf("%s: dropped: %s.", p.key, noMetrics))
			c.dropped("%s: %s", p.key, noMetrics)
		case "groups":
			names, err := c.groups(p.v)
			if err != nil {
				return err
			}
			notes.comment("groups (" + strings.Join(names, ", ") + "): dropped: " + noGroups + ".")
			c.dropped("groups (%s): %s", strings.Join(names, ", "), noGroups)
		case "peers":
			notes.comment("peers: dropped: " + noPeers + ".")
			c.dropped("peers: %s", noPeers)
		case "profiles", "selectors", "routing":
			notes.comment(p.key + ": dropped: napd routes each request by its model name or alias alone.")
			c.dropped("%s: napd routes by model name or alias alone", p.key)
		default:
			notes.comment(p.key + ": dropped: not a llama-swap setting this importer knows.")
			c.dropped("%s: unknown to the importer", p.key)
		}
	}
	switch {
	case globalTTL > 0:
		policy.set("idle_timeout", seconds(globalTTL), "globalTTL")
		c.converted("globalTTL -> [policy] idle_timeout")
	default:
		policy.set("idle_timeout", "0", "llama-swap unloads no model for idleness without a ttl; napd's own default is \"15m\"")
		if globalTTL == 0 {
			c.converted("globalTTL: 0 -> [policy] idle_timeout = \"0\"")
		}
	}
	if models == nil {
		return &Error{Line: doc.Line, Msg: "no models: a llama-swap configuration has a models mapping"}
	}
	if err := c.models(models); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# napd configuration converted from llama-swap's %s by napctl import llama-swap.\n", c.opts.File)
	b.WriteString("# Check it with napd --check; docs/migrating.md says what changed.\n")
	agent.write(&b, "[agent]")
	gateway.write(&b, "[gateway]")
	policy.write(&b, "[policy]")
	notes.write(&b, "")
	c.res.Host = b.String()
	return nil
}

// macroTable reads a macros mapping: names to scalar values.
func (c *conv) macroTable(n *yaml.Node, what string) (map[string]string, error) {
	pairs, err := c.mapping(n, what)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range pairs {
		if !regexp.MustCompile(`^[A-Za-z0-9_.-]+$`).MatchString(p.key) {
			return nil, fail(p.kn, "%s: %q is not a macro name (letters, digits, _, . and -)", what, p.key)
		}
		if p.key == "PORT" || p.key == "MODEL_ID" {
			return nil, fail(p.kn, "%s: ${%s} is llama-swap's own macro", what, p.key)
		}
		if out[p.key], err = c.scalar(p.v, what+"."+p.key); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hooks reads hooks.on_startup.preload.
func (c *conv) hooks(n *yaml.Node, notes *section) error {
	pairs, err := c.mapping(n, "hooks")
	if err != nil {
		return err
	}
	for _, p := range pairs {
		if p.key != "on_startup" {
			notes.comment("hooks." + p.key + ": dropped: not a hook this importer knows.")
			c.dropped("hooks.%s: unknown to the importer", p.key)
			continue
		}
		startup, err := c.mapping(p.v, "hooks.on_startup")
		if err != nil {
			return err
		}
		for _, q := range startup {
			if q.key != "preload" {
				notes.comment("hooks.on_startup." + q.key + ": dropped: not a hook this importer knows.")
				c.dropped("hooks.on_startup.%s: unknown to the importer", q.key)
				continue
			}
			ids, err := c.strings(q.v, "hooks.on_startup.preload")
			if err != nil {
				return err
			}
			for _, id := range ids {
				c.preload[id] = true
			}
			c.converted("hooks.on_startup.preload -> warm_on_start of %s", strings.Join(ids, ", "))
		}
	}
	return nil
}

// groups reads the groups' names (their rules have no napd equivalent).
func (c *conv) groups(n *yaml.Node) ([]string, error) {
	pairs, err := c.mapping(n, "groups")
	if err != nil {
		return nil, err
	}
	names := make([]string, len(pairs))
	for i, p := range pairs {
		names[i] = p.key
	}
	return names, nil
}

// apiKeys turns the keys into api_keys_file lines.
func (c *conv) apiKeys(n *yaml.Node, keys []string, gateway *section) error {
	if len(keys) == 0 {
		return nil
	}
	if c.opts.KeysFile == "" {
		return fail(n, "apiKeys: %d keys, and no file to write them to: give --keys FILE (napd's api_keys_file)", len(keys))
	}
	var b strings.Builder
	b.WriteString("# API keys converted from llama-swap's apiKeys; name:key, one a line (docs/keys.md).\n")
	for i, k := range keys {
		if k == "" || strings.ContainsAny(k, " \t\r\n#") {
			return fail(n, "apiKeys: key %d is empty or holds a space or #, which napd's keys file cannot hold", i+1)
		}
		fmt.Fprintf(&b, "llama-swap-%d:%s\n", i+1, k)
	}
	c.res.Keys = b.String()
	gateway.set("api_keys_file", c.opts.KeysFile, fmt.Sprintf("apiKeys: %d keys, named llama-swap-1...", len(keys)))
	c.converted("apiKeys -> %s (%d keys)", c.opts.KeysFile, len(keys))
	return nil
}

// proxyPort reads a model's proxy: 0 for ${PORT} (napd picks the port).
func proxyPort(proxy string) (int, string) {
	u, err := url.Parse(strings.ReplaceAll(proxy, "${PORT}", "0"))
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return -1, "not an http:// URL"
	}
	switch h := u.Hostname(); h {
	case "localhost", "127.0.0.1", "::1":
	default:
		return -1, "napd reaches engines on 127.0.0.1 only, not " + h
	}
	if u.Path != "" && u.Path != "/" {
		return -1, "napd forwards request paths unchanged: no path prefix " + u.Path
	}
	if u.Port() == "0" || u.Port() == "" {
		if u.Port() == "" {
			return -1, "it names no port"
		}
		return 0, ""
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil || p < 1 || p > 65535 {
		return -1, "bad port"
	}
	return p, ""
}

// modelName is a llama-swap model id as a napd model name.
func modelName(id string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(id) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := strings.TrimLeft(b.String(), "._-")
	if len(name) > 64 {
		name = name[:64]
	}
	if name == "" {
		name = "model"
	}
	return name
}

// validAlias is what napd accepts as an alias.
func validAlias(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

// models converts the models mapping.
func (c *conv) models(n *yaml.Node) error {
	pairs, err := c.mapping(n, "models")
	if err != nil {
		return err
	}
	if len(pairs) == 0 {
		return fail(n, "models: none defined")
	}
	taken := map[string]bool{}
	var names []string
	for _, p := range pairs {
		name := modelName(p.key)
		for i := 2; taken[name]; i++ {
			name = fmt.Sprintf("%s-%d", strings.TrimSuffix(modelName(p.key)[:min(len(modelName(p.key)), 60)], "-"), i)
		}
		taken[name] = true
		names = append(names, name)
	}
	var converted []string
	for i, p := range pairs {
		m, err := c.model(names[i], p, taken)
		if err != nil {
			return err
		}
		if m.Converted {
			converted = append(converted, m.Name)
		}
		c.res.Models = append(c.res.Models, m)
	}
	c.converted("models: %d (%s)", len(converted), strings.Join(converted, ", "))
	return nil
}
