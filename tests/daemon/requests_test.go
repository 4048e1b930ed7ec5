package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// usageOf reads the last usage object of a plain or streamed answer.
func usageOf(t *testing.T, body string) (prompt, completion float64) {
	t.Helper()
	var u struct {
		Usage *struct {
			Prompt     float64 `json:"prompt_tokens"`
			Completion float64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	found := false
	for _, doc := range append([]string{body}, strings.Split(body, "\n")...) {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "data: ")
		if json.Unmarshal([]byte(doc), &u) == nil && u.Usage != nil {
			prompt, completion, found = u.Usage.Prompt, u.Usage.Completion, true
		}
	}
	if !found {
		t.Fatalf("no usage in %s", body)
	}
	return prompt, completion
}

// After a scripted set of requests under scoped keys, the metrics count
// requests by client and code, time them per model, kind and stream, and
// count tokens per client from a plain and a streamed answer; a reload of
// the keys file takes effect and drops the removed key's series.
func TestMetrics_RequestsTokensAndScopedKeys(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "api-keys")
	writeFile(t, keys, "alice:sk-alice models=m concurrency=2\nbob:sk-bob\n")
	n := harness.Start(t, harness.Options{
		Models:  demo("m", "") + demo("secret", ""),
		Gateway: "api_keys_file = " + strconv.Quote(keys),
	})
	ctx := context.Background()
	alice := []string{"Authorization", "Bearer sk-alice"}
	bob := []string{"Authorization", "Bearer sk-bob"}

	plain := post(ctx, n, "m", harness.Chat("m", false, 3), alice...)
	streamed := post(ctx, n, "m", strings.Replace(harness.Chat("m", true, 4), `"stream":true`,
		`"stream":true,"stream_options":{"include_usage":true}`, 1), alice...)
	byBob := post(ctx, n, "m", harness.Chat("m", false, 2), bob...)
	for _, r := range []result{plain, streamed, byBob} {
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request: %v", r)
		}
	}
	p1, c1 := usageOf(t, plain.body)
	p2, c2 := usageOf(t, streamed.body)
	p3, c3 := usageOf(t, byBob.body)
	// alice may not use "secret" (which exists) nor "nosuch" (which does
	// not): the same 403 for both.
	denied := post(ctx, n, "secret", harness.Chat("secret", false, 2), alice...)
	missing := post(ctx, n, "nosuch", harness.Chat("nosuch", false, 2), alice...)
	if denied.status != http.StatusForbidden || missing.status != http.StatusForbidden ||
		strings.ReplaceAll(denied.body, "secret", "X") != strings.ReplaceAll(missing.body, "nosuch", "X") {
		t.Errorf("denied models:\n%v\n%v", denied, missing)
	}

	fams := scrape(t, n)
	counter := func(name string, labels map[string]string, want float64) {
		t.Helper()
		if v := value(sample(fams, name, labels)); v != want {
			t.Errorf("%s%v = %v, want %v", name, labels, v, want)
		}
	}
	histCount := func(name string, labels map[string]string) uint64 {
		s := sample(fams, name, labels)
		if s == nil || s.Histogram == nil {
			return 0
		}
		return s.Histogram.GetSampleCount()
	}
	counter("napd_requests_total", map[string]string{"model": "m", "client": "alice", "code": "200"}, 2)
	counter("napd_requests_total", map[string]string{"model": "m", "client": "bob", "code": "200"}, 1)
	counter("napd_requests_total", map[string]string{"model": "", "client": "alice", "code": "403"}, 2)
	counter("napd_prompt_tokens_total", map[string]string{"model": "m", "client": "alice"}, p1+p2)
	counter("napd_completion_tokens_total", map[string]string{"model": "m", "client": "alice"}, c1+c2)
	counter("napd_completion_tokens_total", map[string]string{"model": "m", "client": "bob"}, c3)
	if c1 != 3 || c2 != 4 || p3 <= 0 {
		t.Errorf("usage read from the answers: %v/%v %v/%v %v/%v", p1, c1, p2, c2, p3, c3)
	}
	for _, c := range []struct {
		name, stream string
		want         uint64
	}{
		{"napd_request_duration_seconds", "false", 2},
		{"napd_request_duration_seconds", "true", 1},
		{"napd_request_first_byte_seconds", "true", 1},
		{"napd_request_queue_wait_seconds", "false", 2},
	} {
		labels := map[string]string{"model": "m", "kind": "chat", "stream": c.stream}
		if got := histCount(c.name, labels); got != c.want {
			t.Errorf("%s%v: %d samples, want %d", c.name, labels, got, c.want)
		}
	}
	// The first request woke m: its wait is in the wake histogram.
	if got := histCount("napd_request_wake_wait_seconds", map[string]string{"model": "m", "stream": "false"}); got != 1 {
		t.Errorf("napd_request_wake_wait_seconds{model=m}: %d samples, want 1", got)
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "client" && !map[string]bool{"": true, "alice": true, "bob": true}[l.GetValue()] {
					t.Errorf("%s has client label %q: not a key's name", name, l.GetValue())
				}
				if l.GetName() == "model" && !map[string]bool{"": true, "m": true, "secret": true}[l.GetValue()] {
					t.Errorf("%s has model label %q: not a configured model", name, l.GetValue())
				}
			}
		}
	}

	// Reload: bob removed, alice moved to "secret" only.
	writeFile(t, keys, "alice:sk-alice models=secret\n")
	n.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(15 * time.Second)
	for post(ctx, n, "m", harness.Chat("m", false, 1), bob...).status != http.StatusUnauthorized {
		if time.Now().After(deadline) {
			t.Fatal("the reloaded keys file did not take effect")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := post(ctx, n, "m", harness.Chat("m", false, 1), alice...); r.status != http.StatusForbidden {
		t.Errorf("alice on m after the reload: %v", r)
	}
	fams = scrape(t, n)
	if s := sample(fams, "napd_completion_tokens_total", map[string]string{"client": "bob"}); s != nil {
		t.Errorf("the removed key's series remain: %v", s)
	}
}
