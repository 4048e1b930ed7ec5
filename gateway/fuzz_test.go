package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func FuzzParseAPIKeys(f *testing.F) {
	f.Add([]byte("alice:sk-1\nbob:sk-2\n"))
	f.Add([]byte("# c\n\n a : b:c \n"))
	f.Add([]byte("x:y\nx:z\n"))
	f.Add([]byte(":\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := parseAPIKeys("f", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f:") {
				t.Errorf("error %q does not name the file", err)
			}
			return
		}
		// Every parsed line's key must authenticate as its own name.
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || line[0] == '#' {
				continue
			}
			name, key, _ := strings.Cut(line, ":")
			got, ok := k.check("Bearer " + strings.TrimSpace(key))
			if !ok || got != strings.TrimSpace(name) {
				t.Errorf("key of %q authenticates as %q, %v", name, got, ok)
			}
		}
	})
}

func FuzzParseTimeout(f *testing.F) {
	for _, s := range []string{"30", "30s", "1m30s", "0.5", "-1", "0", "NaN", "Inf", "1e300", "soon", "1h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseTimeout(s)
		if err == nil && d <= 0 {
			t.Errorf("parseTimeout(%q) = %v, want a positive duration", s, d)
		}
	})
}

func FuzzParseBody(f *testing.F) {
	for _, s := range []string{`{"model":"m","stream":true}`, `{"model":1}`, `null`, `[]`, `{"stream":"yes"}`, `{"model":"\u00e9"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fields, err := parseBody(body)
		if err != nil {
			return
		}
		// What the gateway found must be what a full decode finds.
		var full map[string]any
		if json.Unmarshal(body, &full) != nil || full == nil {
			return
		}
		if m, ok := full["model"].(string); ok && m != fields.Model && !hasFoldedDuplicate(full, "model") {
			t.Errorf("model %q, full decode %q", fields.Model, m)
		}
	})
}

// hasFoldedDuplicate reports a key spelled in other cases too ("Model"):
// encoding/json matches fields case-insensitively.
func hasFoldedDuplicate(m map[string]any, key string) bool {
	n := 0
	for k := range m {
		if strings.EqualFold(k, key) {
			n++
		}
	}
	return n > 1
}

func TestParseTimeout(t *testing.T) {
	for s, want := range map[string]time.Duration{"30": 30 * time.Second, "2.5": 2500 * time.Millisecond, "90s": 90 * time.Second, "1m30s": 90 * time.Second} {
		if d, err := parseTimeout(s); err != nil || d != want {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v", s, d, err, want)
		}
	}
	for _, s := range []string{"", "0", "-1", "0s", "-3s", "NaN", "soon", "30 s"} {
		if _, err := parseTimeout(s); err == nil {
			t.Errorf("parseTimeout(%q) accepted", s)
		}
	}
}
