// Package pathrule parses and matches the engine path rules of
// gateway.upstream_deny and gateway.upstream_allow ("PATTERN" or "METHOD
// PATTERN", `*` for any run of characters), and the glob patterns they and
// the API keys' models= share. It is its own package so that agent/config
// can check a rule without linking the gateway (napctl and the demo engine
// read the config too).
package pathrule

import (
	"fmt"
	"path"
	"strings"
)

// DefaultDeny are the engine routes no client may reach through
// napd: each puts an engine to sleep, wakes it, changes its weights or
// adapters, flushes its caches, pauses it or runs code in it. They belong to
// napd (sleep and wake) or to the operator. An entry is "PATTERN" (any
// method) or "METHOD PATTERN"; in a pattern `*` stands for any run of
// characters, '/' included.
var DefaultDeny = []string{
	// vLLM (dev mode, profiler, generate task, runtime LoRA).
	"/sleep", "/wake_up", "/is_sleeping", "/collective_rpc",
	"/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/server_info",
	"/start_profile", "/stop_profile",
	"/pause", "/resume", "/is_paused", "/scale_elastic_ep", "/is_scaling_elastic_ep",
	"/update_weights", "/init_weight_transfer_engine", "/get_world_size", "/abort_requests",
	"/v1/load_lora_adapter", "/v1/unload_lora_adapter",
	// SGLang.
	"/flush_cache", "/release_memory_occupation", "/resume_memory_occupation",
	"/update_weight*", "/*weights*group*", "/send_weights_to_remote_instance",
	"/load_lora_adapter", "/unload_lora_adapter", "/abort_request",
	"/pause_generation", "/continue_generation", "/set_internal_state", "/slow_down",
	"/freeze_gc", "/*expert_distribution_record", "/configure_logging",
	"/open_session", "/close_session", "/clear_hicache_storage_backend",
	// llama.cpp server: its state-changing routes only (GET /props, /slots
	// and /lora-adapters are read-only and stay reachable).
	"POST /props", "POST /slots/*", "POST /lora-adapters",
	"POST /models", "DELETE /models", "POST /models/load", "POST /models/unload",
}

// rule is one parsed upstream_deny or upstream_allow entry.
type rule struct {
	method  string // "" = any
	pattern string
}

// Rules decide which engine paths a client may reach: a path is refused
// when a deny rule matches it and no allow rule does. The zero value
// refuses nothing.
type Rules struct {
	deny, allow ruleSet
}

// ruleSet is a list of rules as every request matches them: the patterns
// without wildcards, most of them, by a map lookup, the others one by one
// (a glob per rule cost 0.3 us per request), each only on a path that
// holds its longest literal run.
type ruleSet struct {
	exact map[string][]string // pattern -> methods ("" = any)
	globs []globRule
}

// globRule is a rule with wildcards and the longest run of its pattern
// without any: a path that lacks it cannot match.
type globRule struct {
	rule
	literal string
}

func (s *ruleSet) add(r rule) {
	if strings.ContainsAny(r.pattern, "*?") {
		g := globRule{rule: r}
		for run := range strings.FieldsFuncSeq(r.pattern, func(r rune) bool { return r == '*' || r == '?' }) {
			if len(run) > len(g.literal) {
				g.literal = run
			}
		}
		s.globs = append(s.globs, g)
		return
	}
	if s.exact == nil {
		s.exact = make(map[string][]string)
	}
	s.exact[r.pattern] = append(s.exact[r.pattern], r.method)
}

func (s *ruleSet) match(method, p string) bool {
	for _, m := range s.exact[p] {
		if m == "" || m == method {
			return true
		}
	}
	for _, g := range s.globs {
		if (g.method == "" || g.method == method) && strings.Contains(p, g.literal) && Match(g.pattern, p) {
			return true
		}
	}
	return false
}

// Check checks one upstream_deny / upstream_allow entry.
func Check(s string) error {
	_, err := parse(s)
	return err
}

func parse(s string) (rule, error) {
	method, pattern, ok := strings.Cut(s, " ")
	if !ok {
		method, pattern = "", s
	}
	switch {
	case method != "" && strings.ToUpper(method) != method:
		return rule{}, fmt.Errorf("%q: the method must be upper case", s)
	case pattern == "*":
	case !strings.HasPrefix(pattern, "/"):
		return rule{}, fmt.Errorf("%q: want \"/path\" or \"METHOD /path\" (`*` matches anything)", s)
	}
	return rule{method: method, pattern: strings.ToLower(pattern)}, nil
}

// New builds the rules from DefaultDeny plus deny, less what allow
// exempts. Entries must have passed Check; others are left out.
func New(deny, allow []string) Rules {
	var r Rules
	for _, s := range append(append([]string(nil), DefaultDeny...), deny...) {
		if p, err := parse(s); err == nil {
			r.deny.add(p)
		}
	}
	for _, s := range allow {
		if p, err := parse(s); err == nil {
			r.allow.add(p)
		}
	}
	return r
}

// Refused reports whether a request for method and the decoded engine path
// p must not reach the engine. The path is matched as the engine routes it:
// cleaned ("//sleep", "/a/../sleep" and "/sleep/" are "/sleep") and without
// regard to case, so no spelling slips past a rule.
func (r Rules) Refused(method, p string) bool {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	// Clean and ToLower return an already clean lower-case path as it is.
	clean := strings.ToLower(path.Clean(p))
	return r.deny.match(method, clean) && !r.allow.match(method, clean)
}

// Match matches name against pattern: '*' is any run of characters
// (including '/', which model names such as org/model and engine paths
// contain), '?' one character, everything else itself. Used by the engine
// path rules and the API keys' model patterns.
func Match(pattern, name string) bool {
	// Iterative matching with backtracking to the last star: linear in
	// practice, never exponential.
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == name[n]):
			p++
			n++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case star >= 0:
			p = star + 1
			mark++
			n = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
