package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/napd/napd/agent/priority"
)

// Size units accepted by ParseSize. Only binary units: "GB" is ambiguous
// (10^9 or 2^30 depending on who prints it) and GPU tools report MiB/GiB.
var sizeUnits = map[string]int64{
	"B":   1,
	"KiB": 1 << 10,
	"MiB": 1 << 20,
	"GiB": 1 << 30,
	"TiB": 1 << 40,
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`)

// ParseSize parses a size such as "24GiB", "512MiB", "1.5GiB" or "0" into
// bytes. A fraction is allowed and the result is rounded down to whole bytes;
// only "0" may omit the unit.
func ParseSize(s string) (int64, error) {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("bad size %q (want a number and a unit, e.g. \"24GiB\", \"512MiB\")", s)
	}
	num, unit := m[1], m[2]
	if unit == "" {
		if n, err := strconv.ParseFloat(num, 64); err == nil && n == 0 {
			return 0, nil
		}
		return 0, fmt.Errorf("bad size %q: missing unit (B, KiB, MiB, GiB or TiB)", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("bad size %q: unknown unit %q (use B, KiB, MiB, GiB or TiB)", s, unit)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("bad size %q", s)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	bytes := new(big.Int).Quo(r.Num(), r.Denom())
	if !bytes.IsInt64() {
		return 0, fmt.Errorf("bad size %q: too large", s)
	}
	return bytes.Int64(), nil
}

// FormatSize writes n bytes in the largest binary unit that holds it
// whole ("24GiB", "1536MiB", "0"), as ParseSize reads it.
func FormatSize(n int64) string {
	if n == 0 {
		return "0"
	}
	for _, u := range []string{"TiB", "GiB", "MiB", "KiB"} {
		if m := sizeUnits[u]; n%m == 0 {
			return strconv.FormatInt(n/m, 10) + u
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// formatDuration writes d as ParseDuration reads it, without Go's zero
// minutes and seconds ("1h", "10m", "1h30m", "90s", "0").
func formatDuration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ParseDuration parses a non-negative duration such as "90s", "10m",
// "1h30m" or "0".
func ParseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q (want e.g. \"90s\", \"10m\", \"1h30m\" or \"0\")", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("bad duration %q: must not be negative", s)
	}
	return d, nil
}

// tomlType names the TOML type of a decoded value for error messages.
func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case int64:
		return "integer"
	case float64:
		return "float"
	case bool:
		return "boolean"
	case []any, []map[string]any:
		return "array"
	case map[string]any:
		return "table"
	}
	return "datetime"
}

func wantType(want string, got any) error {
	return fmt.Errorf("want %s, got %s", want, tomlType(got))
}

// The setters below decode one raw TOML value into a typed destination and
// check it; they are composed into each table's schema. Each also reads the
// destination back as a TOML value (for `napctl config show`).

type setter struct {
	set func(raw any) error
	get func() any
}

func setString(dst *string, check func(string) error) setter {
	return setter{get: func() any { return *dst }, set: func(raw any) error {
		s, ok := raw.(string)
		if !ok {
			return wantType("a string", raw)
		}
		if check != nil {
			if err := check(s); err != nil {
				return err
			}
		}
		*dst = s
		return nil
	}}
}

func setEnum[T ~string](dst *T, allowed ...T) setter {
	return setter{get: func() any { return string(*dst) }, set: func(raw any) error {
		s, ok := raw.(string)
		if !ok {
			return wantType("a string", raw)
		}
		if !slices.Contains(allowed, T(s)) {
			return fmt.Errorf("unknown value %q (want %s)", s, quoteList(allowed))
		}
		*dst = T(s)
		return nil
	}}
}

func quoteList[T ~string](vals []T) string {
	q := make([]string, len(vals))
	for i, v := range vals {
		q[i] = strconv.Quote(string(v))
	}
	return strings.Join(q, ", ")
}

// setDuration parses a duration string; zeroOK allows "0".
func setDuration(dst *time.Duration, zeroOK bool) setter {
	return setter{get: func() any { return formatDuration(*dst) }, set: func(raw any) error {
		s, ok := raw.(string)
		if !ok {
			return fmt.Errorf("want a duration string such as \"90s\", got %s", tomlType(raw))
		}
		d, err := ParseDuration(s)
		if err != nil {
			return err
		}
		if d == 0 && !zeroOK {
			return errors.New("must be greater than 0")
		}
		*dst = d
		return nil
	}}
}

// setSize parses a size string; zeroOK allows "0".
func setSize(dst *int64, zeroOK bool) setter {
	return setter{get: func() any { return FormatSize(*dst) }, set: func(raw any) error {
		s, ok := raw.(string)
		if !ok {
			return fmt.Errorf("want a size string such as \"24GiB\", got %s", tomlType(raw))
		}
		n, err := ParseSize(s)
		if err != nil {
			return err
		}
		if n == 0 && !zeroOK {
			return errors.New("must be greater than 0")
		}
		*dst = n
		return nil
	}}
}

func setInt(dst *int, lo, hi int64) setter {
	return setter{get: func() any { return int64(*dst) }, set: func(raw any) error {
		n, ok := raw.(int64)
		if !ok {
			return wantType("an integer", raw)
		}
		if n < lo || n > hi {
			return fmt.Errorf("%d is out of range (want %d to %d)", n, lo, hi)
		}
		*dst = int(n)
		return nil
	}}
}

func setBool(dst *bool) setter {
	return setter{get: func() any { return *dst }, set: func(raw any) error {
		b, ok := raw.(bool)
		if !ok {
			return wantType("a boolean (true or false)", raw)
		}
		*dst = b
		return nil
	}}
}

// setFloat accepts an integer too: `psi_some_avg10 = 20` means 20.0.
func setFloat(dst *float64, lo, hi float64) setter {
	return setter{get: func() any { return *dst }, set: func(raw any) error {
		var f float64
		switch v := raw.(type) {
		case float64:
			f = v
		case int64:
			f = float64(v)
		default:
			return wantType("a number", raw)
		}
		if math.IsNaN(f) || f <= lo || f > hi {
			return fmt.Errorf("%v is out of range (want more than %v, at most %v)", f, lo, hi)
		}
		*dst = f
		return nil
	}}
}

// setStrings decodes an array of strings, checking each element.
func setStrings(dst *[]string, check func(string) error) setter {
	return setter{get: func() any { return nonNil(*dst) }, set: func(raw any) error {
		arr, ok := raw.([]any)
		if !ok {
			return wantType("an array of strings", raw)
		}
		out := make([]string, 0, len(arr))
		for i, el := range arr {
			s, ok := el.(string)
			if !ok {
				return fmt.Errorf("element %d: %w", i, wantType("a string", el))
			}
			if check != nil {
				if err := check(s); err != nil {
					return fmt.Errorf("element %d: %w", i, err)
				}
			}
			out = append(out, s)
		}
		*dst = out
		return nil
	}}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// setRoutes decodes gateway.routes: "METHOD /path" strings, each once.
func setRoutes(dst *[]Route) setter {
	var specs []string
	decode := setStrings(&specs, nil)
	get := func() any {
		out := make([]string, len(*dst))
		for i, r := range *dst {
			out[i] = r.Method + " " + r.Path
		}
		return out
	}
	return setter{get: get, set: func(raw any) error {
		if err := decode.set(raw); err != nil {
			return err
		}
		routes := make([]Route, 0, len(specs))
		seen := map[string]int{}
		for i, spec := range specs {
			r, err := parseRoute(spec)
			if err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
			if prev, dup := seen[r.Path]; dup {
				return fmt.Errorf("element %d: path %s is already routed by element %d", i, r.Path, prev)
			}
			seen[r.Path] = i
			routes = append(routes, r)
		}
		*dst = routes
		return nil
	}}
}

// parseRoute reads "POST /completion" or "GET /props". napd's own paths
// (/v1/…, /upstream/…, /napd/…, /health, and llama.cpp's router API
// /models…) are not the operator's to reroute.
func parseRoute(spec string) (Route, error) {
	method, path, ok := strings.Cut(spec, " ")
	if !ok || (method != "POST" && method != "GET") {
		return Route{}, fmt.Errorf("route %q: want \"POST /path\" (routed by the body's model) or \"GET /path\" (routed by ?model=)", spec)
	}
	switch {
	case !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " ?#%") || hasControl(path):
		return Route{}, fmt.Errorf("route %q: the path must start with / and hold no spaces, ?, # or %%", spec)
	case path == "/v1" || strings.HasPrefix(path, "/v1/") || path == "/upstream" || strings.HasPrefix(path, "/upstream/") ||
		path == "/napd" || strings.HasPrefix(path, "/napd/") || path == "/health" ||
		path == "/models" || strings.HasPrefix(path, "/models/"):
		return Route{}, fmt.Errorf("route %q: %s is one of napd's own paths", spec, path)
	}
	return Route{Method: method, Path: path}, nil
}

// corsOrigin checks an origin as browsers send it in Origin:
// scheme://host[:port], lower case, no path; or "*" for any origin.
func corsOrigin(s string) error {
	if s == "*" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("bad origin %q (want scheme://host[:port], e.g. \"https://chat.example.com\", or \"*\")", s)
	}
	if canon := u.Scheme + "://" + strings.ToLower(u.Host); canon != s {
		return fmt.Errorf("origin %q: write it as browsers send it: %q", s, canon)
	}
	return nil
}

// servedName is a model name as an engine knows it: sent in JSON bodies,
// form fields and query strings, so no control characters.
func servedName(s string) error {
	if s == "" || hasControl(s) {
		return fmt.Errorf("served name %q must be non-empty and hold no control characters", s)
	}
	return nil
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
}

// setCommand decodes an argv: at least the program, which is not empty.
func setCommand(dst *[]string) setter {
	var argv []string
	decode := setStrings(&argv, commandArg)
	return setter{get: func() any { return nonNil(*dst) }, set: func(raw any) error {
		if err := decode.set(raw); err != nil {
			return err
		}
		if len(argv) == 0 {
			return errors.New("must not be empty")
		}
		if argv[0] == "" {
			return errors.New("the program (first element) must not be empty")
		}
		*dst = argv
		return nil
	}}
}

// setGPUs decodes gpus: a fixed list of indexes, "any" (napd chooses one
// GPU at each wake) or { count = N } (napd chooses N). count is set to 0
// for a fixed list.
func setGPUs(dst *[]int, count *int) setter {
	get := func() any {
		switch {
		case *count == 1 && *dst == nil:
			return "any"
		case *count > 0:
			return map[string]any{"count": int64(*count)}
		}
		out := make([]any, len(*dst))
		for i, g := range *dst {
			out[i] = int64(g)
		}
		return out
	}
	return setter{get: get, set: func(raw any) error {
		switch v := raw.(type) {
		case string:
			if v != "any" {
				return fmt.Errorf(`want an array of GPU indexes, "any" or { count = N }, got %q`, v)
			}
			*dst, *count = nil, 1
			return nil
		case map[string]any:
			for k := range v {
				if k != "count" {
					return fmt.Errorf("unknown key %q: the table takes count only", k)
				}
			}
			n, ok := v["count"].(int64)
			if !ok {
				return fmt.Errorf("count: %w", wantType("an integer", v["count"]))
			}
			if n < 1 || n > 64 {
				return fmt.Errorf("count = %d is out of range (1..64)", n)
			}
			*dst, *count = nil, int(n)
			return nil
		}
		arr, ok := raw.([]any)
		if !ok {
			return wantType(`an array of GPU indexes, "any" or { count = N }`, raw)
		}
		out := make([]int, 0, len(arr))
		seen := map[int64]bool{}
		for i, el := range arr {
			n, ok := el.(int64)
			if !ok {
				return fmt.Errorf("element %d: %w", i, wantType("an integer", el))
			}
			if n < 0 || n > 1023 {
				return fmt.Errorf("element %d: GPU index %d is out of range", i, n)
			}
			if seen[n] {
				return fmt.Errorf("GPU %d is listed twice", n)
			}
			seen[n] = true
			out = append(out, int(n))
		}
		*dst, *count = out, 0
		return nil
	}}
}

// setWindows decodes keep_awake: an array of windows (see ParseWindow).
func setWindows(dst *[]Window) setter {
	var texts []string
	decode := setStrings(&texts, nil)
	return setter{get: decode.get, set: func(raw any) error {
		if err := decode.set(raw); err != nil {
			return err
		}
		out := make([]Window, 0, len(texts))
		for _, s := range texts {
			w, err := ParseWindow(s)
			if err != nil {
				return err
			}
			out = append(out, w)
		}
		*dst = out
		return nil
	}}
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func setEnvironment(dst *map[string]string) setter {
	return setter{get: func() any { return nonNilMap(*dst) }, set: func(raw any) error {
		tbl, ok := raw.(map[string]any)
		if !ok {
			return wantType("a table of strings", raw)
		}
		out := make(map[string]string, len(tbl))
		for k, v := range tbl {
			if !envNameRE.MatchString(k) {
				return fmt.Errorf("%q is not a valid environment variable name", k)
			}
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("%s: %w", k, wantType("a string", v))
			}
			out[k] = s
		}
		*dst = out
		return nil
	}}
}

// Checks used by several setters.

func absPath(s string) error {
	if !strings.HasPrefix(s, "/") {
		return fmt.Errorf("%q is not an absolute path", s)
	}
	return nil
}

// maxSocketPath is the longest path a Unix socket can bind: sun_path holds
// 108 bytes with the terminating NUL.
const maxSocketPath = 107

// socketPath checks an absolute path short enough to bind a Unix socket.
func socketPath(s string) error {
	if err := absPath(s); err != nil {
		return err
	}
	if len(s) > maxSocketPath {
		return fmt.Errorf("%q is %d bytes, longer than a Unix socket path may be (%d)", s, len(s), maxSocketPath)
	}
	return nil
}

func optional(check func(string) error) func(string) error {
	return func(s string) error {
		if s == "" {
			return nil
		}
		return check(s)
	}
}

// hostPort checks a TCP listen address "HOST:PORT"; port 0 (any free port)
// is allowed, as it is for net.Listen.
func hostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("bad address %q (want HOST:PORT)", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("bad port in address %q", s)
	}
	return nil
}

// metricName checks a Prometheus metric name (engines use ':' too, as in
// "vllm:num_requests_running").
func metricName(s string) error {
	if !validMetricName.MatchString(s) {
		return fmt.Errorf("bad metric name %q (want letters, digits, '_' and ':', not starting with a digit)", s)
	}
	return nil
}

var validMetricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// zmqAddress checks a ZeroMQ endpoint napd can connect to across processes.
func zmqAddress(s string) error {
	for _, scheme := range []string{"ipc://", "tcp://"} {
		if rest, ok := strings.CutPrefix(s, scheme); ok && rest != "" {
			return nil
		}
	}
	return fmt.Errorf("bad ZeroMQ address %q (want ipc://PATH or tcp://HOST:PORT)", s)
}

func healthPath(s string) error {
	if !strings.HasPrefix(s, "/") {
		return fmt.Errorf("%q must be a path starting with /", s)
	}
	return nil
}

var unitRE = regexp.MustCompile(`^[A-Za-z0-9:_.\\@-]+\.service$`)

func unitName(s string) error {
	if !unitRE.MatchString(s) {
		return fmt.Errorf("%q is not a systemd service name (want e.g. \"vllm-qwen.service\")", s)
	}
	return nil
}

var userRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

func userName(s string) error {
	if !userRE.MatchString(s) {
		return fmt.Errorf("%q is not a user name or UID", s)
	}
	return nil
}

// aliasName allows what clients send as a model name ("default",
// "Qwen/Qwen3-8B") but nothing that cannot survive a header or a log line.
func aliasName(s string) error {
	if s == "" {
		return errors.New("an alias must not be empty")
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("alias %q contains a space or control character", s)
		}
	}
	return nil
}

func commandArg(s string) error {
	if strings.ContainsRune(s, 0) {
		return errors.New("contains a NUL byte")
	}
	return nil
}

var modelNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// validModelName: the name becomes part of a systemd unit name
// (napd-engine-NAME.service), of file names and of metric labels.
func validModelName(name string) error {
	if len(name) > 64 || !modelNameRE.MatchString(name) {
		return fmt.Errorf("model name %q is not allowed (want [a-z0-9][a-z0-9._-]*, at most 64 characters)", name)
	}
	return nil
}

// setClasses decodes [policy] priorities: class names, highest first.
func setClasses(dst *priority.Classes) setter {
	var names []string
	decode := setStrings(&names, nil)
	return setter{get: func() any { return nonNil(*dst) }, set: func(raw any) error {
		if err := decode.set(raw); err != nil {
			return err
		}
		if err := priority.Classes(names).Check(); err != nil {
			return err
		}
		*dst = names
		return nil
	}}
}

// setClass decodes a class name of classes (a model's priority).
func setClass(dst *priority.Class, classes *priority.Classes) setter {
	return setter{get: func() any { return classes.Name(*dst) }, set: func(raw any) error {
		s, ok := raw.(string)
		if !ok {
			return wantType("a class name of [policy] priorities", raw)
		}
		c, err := classes.Parse(s)
		if err != nil {
			return err
		}
		*dst = c
		return nil
	}}
}

// setDurations decodes a table of durations ("0" allowed) by name; the
// names are checked by the caller.
func setDurations(dst *map[string]time.Duration) setter {
	get := func() any {
		out := make(map[string]any, len(*dst))
		for k, d := range *dst {
			out[k] = formatDuration(d)
		}
		return out
	}
	return setter{get: get, set: func(raw any) error {
		tbl, ok := raw.(map[string]any)
		if !ok {
			return wantType(`a table of durations, e.g. { batch = "5s" }`, raw)
		}
		out := make(map[string]time.Duration, len(tbl))
		for k, v := range tbl {
			var d time.Duration
			if err := setDuration(&d, true).set(v); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			out[k] = d
		}
		*dst = out
		return nil
	}}
}
