package gateway

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/gateway/pathrule"
	"github.com/napd/napd/internal/statefile"
)

// APIKeys is a parsed api_keys_file: named bearer keys and what each may
// do. Only SHA-256 digests of the keys are kept, so every comparison has
// the same length.
type APIKeys struct {
	names   []string
	digests [][sha256.Size]byte
	scopes  []*Scope // parallel to names
	byName  map[string]*Scope
}

// Role is what a key may do.
type Role string

const (
	// RoleInference may call the OpenAI API of the models it may use.
	RoleInference Role = "inference"
	// RoleAdmin may also use the admin API and the status page (/napd/).
	RoleAdmin Role = "admin"
)

// Scope is what one key may do: its optional fields in the keys file. A key
// without fields may use every model for inference, without a limit of its
// own, as keys always could.
type Scope struct {
	Name string
	// Models are the patterns of the model names (or aliases) the key may
	// use; nil means every model. '*' matches any run of characters, '?'
	// one character.
	Models []string
	Role   Role
	// Concurrency is the most requests the key may have in flight at once;
	// 0 means no limit of its own.
	Concurrency int
	// Priority is the key's class (priority=, resolved against [policy]
	// priorities by LoadAPIKeys); None: the model's default. PriorityName
	// is the name as written.
	Priority     priority.Class
	PriorityName string
	// GPUHoursPerDay and TokensPerDay are the key's quotas per day
	// (docs/keys.md); 0 means none.
	GPUHoursPerDay float64
	TokensPerDay   int64
	line           int // in the keys file, for messages
	// Control: the key may load and unload models through llama.cpp's
	// router API (POST /models/load, /models/unload), as an admin key may,
	// without the admin API.
	Control bool
	// inflight counts the key's requests; a reload hands it to the key of
	// the same name, so a limit holds across reloads.
	inflight *atomic.Int64
}

// maxKeyConcurrency bounds the concurrency field (a typo such as 1e9 is an
// error, not "unlimited").
const maxKeyConcurrency = 100000

// maxGPUHours and maxTokens bound the quota fields (a typo such as 1e12
// is an error, not "unlimited").
const (
	maxGPUHours = 1e6
	maxTokens   = 1e15
)

// maxKeysFile bounds an api_keys_file (a million keys fit).
const maxKeysFile = 64 << 20

// LoadAPIKeys reads an api_keys_file: one key per line, '#' comments and
// blank lines ignored. A line is "name:key", optionally followed by
// whitespace-separated fields:
//
//	alice:sk-alice models=llama-*,qwen2.5 concurrency=4
//	ops:sk-ops role=admin
//
// Errors name the file and the line and never contain a key. A key's
// priority= must name one of classes ([policy] priorities).
func LoadAPIKeys(path string, classes priority.Classes) (*APIKeys, error) {
	data, err := statefile.ReadRegular(path, maxKeysFile)
	if err != nil {
		return nil, fmt.Errorf("api keys: %w", err)
	}
	k, err := parseAPIKeys(path, data)
	if err != nil {
		return nil, err
	}
	if err := k.resolveClasses(path, classes); err != nil {
		return nil, err
	}
	return k, nil
}

// resolveClasses resolves each key's priority= against classes.
func (k *APIKeys) resolveClasses(file string, classes priority.Classes) error {
	for i, s := range k.scopes {
		if s.PriorityName == "" {
			continue
		}
		c, err := classes.Parse(s.PriorityName)
		if err != nil {
			return fmt.Errorf("%s:%d: key %q: priority=%s: %w", file, s.line, k.names[i], s.PriorityName, err)
		}
		s.Priority = c
	}
	return nil
}

func parseAPIKeys(file string, data []byte) (*APIKeys, error) {
	k := &APIKeys{byName: map[string]*Scope{}}
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, ok := strings.Cut(line, ":")
		name = strings.TrimSpace(name)
		fields := strings.Fields(rest)
		key := ""
		if len(fields) > 0 {
			key, fields = fields[0], fields[1:]
		}
		switch {
		case !ok:
			return nil, fmt.Errorf("%s:%d: want \"name:key\"", file, n)
		case name == "":
			return nil, fmt.Errorf("%s:%d: empty key name", file, n)
		case key == "":
			return nil, fmt.Errorf("%s:%d: key %q is empty", file, n, name)
		case strings.ContainsAny(name, " \t"):
			return nil, fmt.Errorf("%s:%d: key name %q contains a space", file, n, name)
		}
		scope, err := parseScope(name, fields)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: key %q: %w", file, n, name, err)
		}
		scope.line = n
		if prev, dup := names[name]; dup {
			return nil, fmt.Errorf("%s:%d: key name %q already used on line %d", file, n, name, prev)
		}
		d := sha256.Sum256([]byte(key))
		if prev, dup := digests[d]; dup {
			return nil, fmt.Errorf("%s:%d: key %q repeats the key of line %d", file, n, name, prev)
		}
		names[name], digests[d] = n, n
		k.names = append(k.names, name)
		k.digests = append(k.digests, d)
		k.scopes = append(k.scopes, scope)
		k.byName[name] = scope
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(k.names) == 0 {
		return nil, fmt.Errorf("%s: no keys (remove api_keys_file to turn keys off)", file)
	}
	return k, nil
}

// parseScope reads a key's optional fields. An error never quotes a
// field without '=': it may be the rest of a key written with a space.
func parseScope(name string, fields []string) (*Scope, error) {
	s := &Scope{Name: name, Role: RoleInference, inflight: new(atomic.Int64)}
	seen := map[string]bool{}
	for _, f := range fields {
		field, value, ok := strings.Cut(f, "=")
		if !ok {
			return nil, errors.New("text after the key that is not a field (want " + fieldList + "; a key cannot contain spaces)")
		}
		if seen[field] {
			return nil, fmt.Errorf("field %q given twice", field)
		}
		seen[field] = true
		if value == "" {
			return nil, fmt.Errorf("field %q is empty", field)
		}
		switch field {
		case "models":
			for _, p := range strings.Split(value, ",") {
				if p == "" {
					return nil, fmt.Errorf("models=%s: empty pattern", value)
				}
				s.Models = append(s.Models, p)
			}
		case "role":
			switch r := Role(value); r {
			case RoleInference, RoleAdmin:
				s.Role = r
			default:
				return nil, fmt.Errorf("role=%s: want %q or %q", value, RoleInference, RoleAdmin)
			}
		case "concurrency":
			c, err := strconv.Atoi(value)
			if err != nil || c < 1 || c > maxKeyConcurrency {
				return nil, fmt.Errorf("concurrency=%s: want a whole number from 1 to %d", value, maxKeyConcurrency)
			}
			s.Concurrency = c
		case "priority":
			s.PriorityName = value
		case "gpu_hours_per_day":
			h, err := strconv.ParseFloat(value, 64)
			if err != nil || !(h > 0 && h <= maxGPUHours) {
				return nil, fmt.Errorf("gpu_hours_per_day=%s: want a number of GPU hours above 0, at most %g", value, float64(maxGPUHours))
			}
			s.GPUHoursPerDay = h
		case "tokens_per_day":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 1 || n > maxTokens {
				return nil, fmt.Errorf("tokens_per_day=%s: want a whole number from 1 to %d", value, int64(maxTokens))
			}
			s.TokensPerDay = n
		case "control":
			switch value {
			case "true":
				s.Control = true
			case "false":
			default:
				return nil, fmt.Errorf("control=%s: want true or false", value)
			}
		default:
			return nil, fmt.Errorf("unknown field %q (want %s)", field, fieldList)
		}
	}
	if s.Role == RoleAdmin && (s.GPUHoursPerDay > 0 || s.TokensPerDay > 0) {
		return nil, errors.New("an admin key is never limited: gpu_hours_per_day= and tokens_per_day= are for inference keys")
	}
	return s, nil
}

// fieldList names the fields a key may have, for messages.
const fieldList = "models=, role=, concurrency=, control=, priority=, gpu_hours_per_day= or tokens_per_day="

// Limited reports a key with a quota (an admin key never has one).
func (s *Scope) Limited() bool {
	return s != nil && s.Role != RoleAdmin && (s.GPUHoursPerDay > 0 || s.TokensPerDay > 0)
}

// Scopes lists the keys' scopes, in the file's order.
func (k *APIKeys) Scopes() []*Scope { return append([]*Scope(nil), k.scopes...) }

// Names lists the keys' names (the client labels).
func (k *APIKeys) Names() []string { return append([]string(nil), k.names...) }

// Inherit makes the in-flight counts of old's keys those of k's keys of the
// same name, so a per-key limit holds while requests admitted before a
// reload finish.
func (k *APIKeys) Inherit(old *APIKeys) {
	if old == nil {
		return
	}
	for name, s := range k.byName {
		if o := old.byName[name]; o != nil {
			s.inflight = o.inflight
		}
	}
}

// scope is the named key's scope.
func (k *APIKeys) scope(name string) *Scope { return k.byName[name] }

// MayUse reports whether the key may use the model named requested, which
// resolved to model (the model's own name): a pattern may match either. A
// nil scope (keys off) may use every model.
func (s *Scope) MayUse(requested, model string) bool {
	if s == nil || s.Models == nil {
		return true
	}
	for _, p := range s.Models {
		if pathrule.Match(p, requested) || (model != "" && pathrule.Match(p, model)) {
			return true
		}
	}
	return false
}

// mayList reports whether GET /v1/models shows m to the key: when it may
// use m by its name or one of its aliases. A nil scope (keys off) sees all.
func (s *Scope) mayList(m ModelInfo) bool {
	if s.MayUse(m.Name, m.Name) {
		return true
	}
	for _, a := range m.Aliases {
		if s.MayUse(a, "") {
			return true
		}
	}
	return false
}

// mayControl reports whether the key may load and unload models (the
// router API): an admin key, or one with control=true.
func (s *Scope) mayControl() bool { return s.Role == RoleAdmin || s.Control }

// acquire takes one of the key's concurrency slots; release gives it back.
func (s *Scope) acquire() bool {
	if s.Concurrency == 0 {
		return true
	}
	if s.inflight.Add(1) > int64(s.Concurrency) {
		s.inflight.Add(-1)
		return false
	}
	return true
}

func (s *Scope) release() {
	if s.Concurrency > 0 {
		s.inflight.Add(-1)
	}
}

// Len is the number of keys.
func (k *APIKeys) Len() int { return len(k.names) }

// credential is the key a request presents: `Authorization: Bearer <key>`
// (the scheme in any case, as RFC 9110 has it) or, for Anthropic-style
// clients, `x-api-key: <key>`. ok is false when neither is present.
func credential(h http.Header) (key string, ok bool) {
	if a := headerValue(h, "Authorization"); a != "" {
		scheme, token, found := strings.Cut(a, " ")
		if !found || !strings.EqualFold(scheme, "Bearer") {
			return "", false
		}
		return strings.TrimLeft(token, " "), true
	}
	if k := headerValue(h, "X-Api-Key"); k != "" {
		return k, true
	}
	return "", false
}

// check matches the request's credential against every key and returns
// the matching key's name. It compares against all keys, in constant time,
// so timing reveals neither whether nor which key matched.
func (k *APIKeys) check(h http.Header) (string, bool) {
	token, ok := credential(h)
	d := sha256.Sum256([]byte(token))
	match := -1
	for i := range k.digests {
		if subtle.ConstantTimeCompare(d[:], k.digests[i][:]) == 1 {
			match = i
		}
	}
	if !ok || match < 0 {
		return "", false
	}
	return k.names[match], true
}
