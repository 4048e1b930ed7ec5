package planner

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/tests/harness"
)

// keysFile writes an API keys file of lines.
func keysFile(t *testing.T, lines string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func bearer(key string) []string { return []string{"Authorization", "Bearer " + key} }

// Two keys, interactive and batch, on two models that do not fit
// together: a continuous batch load on a, an interactive request for b.
// a's yield_after is ten minutes, longer than b's deadline, so without
// classes b would time out; a serves only batch, so it yields to b after
// batch's priority_yield_after. b is served, the decision names the
// classes, and a's batch requests that arrive during the yield are
// queued, not refused, and served after b.
func TestPriority_BatchHolderYieldsToInteractive(t *testing.T) {
	keys := keysFile(t, "ide:sk-ide-0123456789 priority=interactive\nnightly:sk-nightly-0123456789 priority=batch\n")
	policy := harness.DefaultPolicy + "yield_after = \"10m\"\npriority_yield_after = { batch = \"1s\" }\n"
	n := twoThatDoNotFitWith(t, harness.Options{Policy: policy, Gateway: "api_keys_file = " + strconv.Quote(keys)}, "", "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("a", false, 1), bearer("sk-nightly-0123456789")...); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a: %v %v %s", resp, err, body)
	}
	end := keepBusy(n, "a", 15, bearer("sk-nightly-0123456789")...)
	time.Sleep(700 * time.Millisecond) // let a's batch run
	resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("b", false, 2),
		append(bearer("sk-ide-0123456789"), "X-Request-Timeout", "60s")...)
	bDone := time.Now()
	batch := end()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("b (interactive) behind a batch load: %v %v %s", resp, err, body)
	}
	if got := resp.Header.Get("X-Napd-Priority"); got != "interactive" {
		t.Errorf("b ran as %q", got)
	}
	if !strings.Contains(n.Log(), "a serves only batch (priority_yield_after batch = 1s)") {
		t.Error("the yield decision does not name the classes")
	}
	yielded := logTime(t, n, "decision.reason=yield")
	for _, r := range batch {
		if r.status != http.StatusOK {
			t.Errorf("a batch request got %d: requests arriving during the yield must be queued", r.status)
		}
		if r.sent.After(yielded.Add(10*time.Millisecond)) && r.sent.Before(bDone) && r.done.Before(bDone) {
			t.Errorf("a batch request sent %s after a yielded was served before b", r.sent.Sub(yielded))
		}
	}
}

// usageOf reads napctl usage --json.
func usageOf(t *testing.T, n *harness.Napd) control.Usage {
	t.Helper()
	out, err := n.Napctl("usage", "--since", "2h", "--json")
	if err != nil {
		t.Fatalf("napctl usage: %v\n%s", err, out)
	}
	var u control.Usage
	if err := json.Unmarshal([]byte(out), &u); err != nil {
		t.Fatalf("napctl usage --json: %v\n%s", err, out)
	}
	return u
}

func rowOf(u control.Usage, key, model string) (control.UsageRow, bool) {
	for _, r := range u.Rows {
		if r.Key == key && r.Model == model {
			return r, true
		}
	}
	return control.UsageRow{}, false
}

// GPU time per key: a key's requests are charged the model's footprint
// while they run, the wake they caused and their tokens; napctl usage,
// the metrics and the status show them, and they survive a restart. A
// key past its tokens_per_day gets 429 quota_exceeded until the day ends,
// also after a restart; an admin key is never limited.
func TestUsage_AccountedQuotaAndRestart(t *testing.T) {
	keys := keysFile(t, "alice:sk-alice-0123456789\ncapped:sk-capped-0123456789 tokens_per_day=5\nops:sk-ops-0123456789 role=admin\n")
	env := fakeGPU(t, 24<<10, map[string]int{"a": 8 << 10})
	o := harness.Options{Env: env, Gateway: "api_keys_file = " + strconv.Quote(keys), Models: demo("a", `gpu_memory = "8GiB"`)}
	n := harness.Start(t, o)
	requireFakeSMI(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for range 3 {
		if resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("a", false, 15), bearer("sk-alice-0123456789")...); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("alice: %v %v %s", resp, err, body)
		}
	}
	// The first charges come with a's footprint, which the ticker
	// measures: wait for a round.
	var alice control.UsageRow
	deadline := time.Now().Add(30 * time.Second)
	for {
		alice, _ = rowOf(usageOf(t, n), "alice", "a")
		if alice.GPUByteSeconds > 0 || time.Now().After(deadline) {
			break
		}
		if resp, _, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("a", false, 15), bearer("sk-alice-0123456789")...); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("alice: %v %v", resp, err)
		}
	}
	if alice.GPUByteSeconds <= 0 || alice.GPUHours <= 0 || alice.Wakes != 1 || alice.PromptTokens < 3 || alice.CompletionTokens < 45 {
		t.Fatalf("alice's use of a: %+v", alice)
	}
	if !metric(t, n, `napd_wakes_caused_total{key="alice",model="a"} 1`) || !metric(t, n, `napd_gpu_byte_seconds_total{key="alice",model="a"}`) {
		t.Error("the metrics do not show alice's use")
	}

	// capped: 1 prompt token and 4 completion tokens reach its 5.
	if resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("a", false, 4), bearer("sk-capped-0123456789")...); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("capped's first request: %v %v %s", resp, err, body)
	}
	refused := func(when string) {
		t.Helper()
		resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("a", false, 1), bearer("sk-capped-0123456789")...)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), `"code":"quota_exceeded"`) {
			t.Fatalf("%s, capped past its quota: %v %v %s", when, resp, err, body)
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 25*3600 {
			t.Errorf("%s: Retry-After %q, want the seconds to the day's end", when, resp.Header.Get("Retry-After"))
		}
	}
	refused("at once")
	if resp, body, err := n.Post(ctx, "/v1/chat/completions", harness.Chat("a", false, 1), bearer("sk-ops-0123456789")...); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("an admin key: %v %v %s", resp, err, body)
	}
	if out, err := n.Napctl("usage"); err != nil || !strings.Contains(out, "QUOTA TODAY") || !regexpLine(out, `capped\s+0\.000\s+5 of 5`) {
		t.Errorf("napctl usage: %v\n%s", err, out)
	}

	// A restart keeps the figures and the day's use.
	before := usageOf(t, n)
	n.Stop()
	n.Launch(env...)
	after := usageOf(t, n)
	was, _ := rowOf(before, "alice", "a")
	now, ok := rowOf(after, "alice", "a")
	if !ok || now.GPUByteSeconds < was.GPUByteSeconds || now.Wakes != was.Wakes || now.PromptTokens != was.PromptTokens {
		t.Errorf("after a restart alice's use is %+v, was %+v", now, was)
	}
	refused("after a restart")
}

// regexpLine reports whether some line of out matches re.
func regexpLine(out, re string) bool {
	r := regexp.MustCompile(re)
	for _, l := range strings.Split(out, "\n") {
		if r.MatchString(l) {
			return true
		}
	}
	return false
}
