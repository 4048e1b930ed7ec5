package gateway

import (
	"fmt"
	"path"
	"strings"
)

// DefaultUpstreamDeny are the engine routes no client may reach through
// napd: each puts an engine to sleep, wakes it, changes its weights or
// adapters, flushes its caches, pauses it or runs code in it. They belong to
// napd (sleep and wake) or to the operator. An entry is "PATTERN" (any
// method) or "METHOD PATTERN"; in a pattern `*` stands for any run of
// characters, '/' included.
var DefaultUpstreamDeny = []string{
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

// pathRule is one parsed upstream_deny or upstream_allow entry.
type pathRule struct {
	method  string // "" = any
	pattern string
}

// pathRules decide which engine paths a client may reach: a path is refused
// when a deny rule matches it and no allow rule does.
type pathRules struct {
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
	pathRule
	literal string
}

func (s *ruleSet) add(rule pathRule) {
	if strings.ContainsAny(rule.pattern, "*?") {
		g := globRule{pathRule: rule}
		for run := range strings.FieldsFuncSeq(rule.pattern, func(r rune) bool { return r == '*' || r == '?' }) {
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
	s.exact[rule.pattern] = append(s.exact[rule.pattern], rule.method)
}

func (s *ruleSet) match(method, p string) bool {
	for _, m := range s.exact[p] {
		if m == "" || m == method {
			return true
		}
	}
	for _, rule := range s.globs {
		if (rule.method == "" || rule.method == method) && strings.Contains(p, rule.literal) && glob(rule.pattern, p) {
			return true
		}
	}
	return false
}

// ParsePathRule checks one upstream_deny / upstream_allow entry.
func ParsePathRule(s string) error {
	_, err := parsePathRule(s)
	return err
}

func parsePathRule(s string) (pathRule, error) {
	method, pattern, ok := strings.Cut(s, " ")
	if !ok {
		method, pattern = "", s
	}
	switch {
	case method != "" && strings.ToUpper(method) != method:
		return pathRule{}, fmt.Errorf("%q: the method must be upper case", s)
	case pattern == "*":
	case !strings.HasPrefix(pattern, "/"):
		return pathRule{}, fmt.Errorf("%q: want \"/path\" or \"METHOD /path\" (`*` matches anything)", s)
	}
	return pathRule{method: method, pattern: strings.ToLower(pattern)}, nil
}

// newPathRules builds the rules from DefaultUpstreamDeny plus deny, less
// what allow exempts. Entries must have passed ParsePathRule.
func newPathRules(deny, allow []string) pathRules {
	var r pathRules
	for _, s := range append(append([]string(nil), DefaultUpstreamDeny...), deny...) {
		if p, err := parsePathRule(s); err == nil {
			r.deny.add(p)
		}
	}
	for _, s := range allow {
		if p, err := parsePathRule(s); err == nil {
			r.allow.add(p)
		}
	}
	return r
}

// refused reports whether a request for method and the decoded engine path
// p must not reach the engine. The path is matched as the engine routes it:
// cleaned ("//sleep", "/a/../sleep" and "/sleep/" are "/sleep") and without
// regard to case, so no spelling slips past a rule.
func (r pathRules) refused(method, p string) bool {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	// Clean and ToLower return an already clean lower-case path as it is.
	clean := strings.ToLower(path.Clean(p))
	return r.deny.match(method, clean) && !r.allow.match(method, clean)
}
