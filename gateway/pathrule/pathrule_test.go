package pathrule

import (
	"path"
	"strings"
	"testing"
)

func TestRules(t *testing.T) {
	for _, bad := range []string{"sleep", "post /sleep", "POST sleep", ""} {
		if Check(bad) == nil {
			t.Errorf("Check(%q) accepted", bad)
		}
	}
	for _, good := range append([]string{"*", "GET /x/*", "/a*b*c"}, DefaultDeny...) {
		if err := Check(good); err != nil {
			t.Errorf("Check(%q): %v", good, err)
		}
	}
	r := New(nil, []string{"*"})
	if r.Refused("POST", "/sleep") {
		t.Error(`upstream_allow = ["*"] still refuses /sleep`)
	}
	// An entry without wildcards names its method, or any; two entries of
	// one path, each its own.
	r = New([]string{"GET /x", "PUT /x", "/y?"}, []string{"GET /sleep"})
	for _, c := range []struct {
		method, path string
		refused      bool
	}{
		{"GET", "/x", true}, {"PUT", "/x", true}, {"POST", "/x", false},
		{"POST", "/props", true}, {"GET", "/props", false},
		{"GET", "/sleep", false}, {"POST", "/sleep", true},
		{"GET", "/yz", true}, {"GET", "/y", false},
	} {
		if got := r.Refused(c.method, c.path); got != c.refused {
			t.Errorf("%s %s refused: %v, want %v", c.method, c.path, got, c.refused)
		}
	}
	// A long path costs linear time, never a blow-up over the stars.
	long := "/" + strings.Repeat("weights", 20000) + "x"
	if New(nil, nil).Refused("GET", long) {
		t.Error("long path refused")
	}
}

// The path rules' map of exact patterns and list of globs refuse what
// matching each entry's glob in turn refuses.
func FuzzRules(f *testing.F) {
	for _, s := range []string{"/sleep", "/SLEEP/", "/v1/chat/completions", "/update_weights_x", "/a/weights/b/group",
		"/slots/0", "/props", "/x", "/yz", "/a//../sleep"} {
		f.Add("POST", s)
		f.Add("GET", s)
	}
	deny := []string{"GET /x", "/y?", "/a*b", "PUT /sleep"}
	allow := []string{"GET /sleep", "/update_weights_x", "POST /x*"}
	rules := New(deny, allow)
	each := func(entries []string, method, p string) bool {
		for _, s := range entries {
			rule, err := parse(s)
			if err == nil && (rule.method == "" || rule.method == method) && Match(rule.pattern, p) {
				return true
			}
		}
		return false
	}
	f.Fuzz(func(t *testing.T, method, p string) {
		clean := p
		if !strings.HasPrefix(clean, "/") {
			clean = "/" + clean
		}
		clean = strings.ToLower(path.Clean(clean))
		want := each(append(append([]string(nil), DefaultDeny...), deny...), method, clean) && !each(allow, method, clean)
		if got := rules.Refused(method, p); got != want {
			t.Errorf("%s %q refused: %v, each entry's glob says %v", method, p, got, want)
		}
	})
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"*", "", true}, {"*", "a/b", true}, {"a*", "a", true}, {"a*c", "abbbc", true},
		{"a*c", "abbb", false}, {"?", "a", true}, {"?", "", false}, {"a?c", "abc", true},
		{"*a*a*a*a*a*b", strings.Repeat("a", 200), false}, {"exact", "exact", true}, {"exact", "exac", false},
	} {
		if got := Match(c.pattern, c.name); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}
