package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/priority"
)

func TestLoadAPIKeys_ParsesNamesAndKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	data := "# napd keys\n\nalice: sk-alice\n  bob:sk:with:colons  \n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadAPIKeys(path, priority.DefaultClasses)
	if err != nil {
		t.Fatal(err)
	}
	if k.Len() != 2 {
		t.Fatalf("Len %d", k.Len())
	}
	for _, c := range []struct {
		header, name string
		ok           bool
	}{
		{"Bearer sk-alice", "alice", true},
		{"bearer sk-alice", "alice", true},
		{"BEARER sk-alice", "alice", true},
		{"Bearer sk:with:colons", "bob", true},
		{"Bearer sk-alicf", "", false},
		{"Bearer ", "", false},
		{"sk-alice", "", false},
		{"Basic sk-alice", "", false},
		{"", "", false},
	} {
		name, ok := k.check(http.Header{"Authorization": {c.header}})
		if name != c.name || ok != c.ok {
			t.Errorf("check(Authorization: %q) = %q, %v; want %q, %v", c.header, name, ok, c.name, c.ok)
		}
	}
	// Anthropic-style clients send the key as x-api-key.
	for key, want := range map[string]string{"sk-alice": "alice", "sk:with:colons": "bob", "Bearer sk-alice": "", "": ""} {
		h := http.Header{}
		h.Set("x-api-key", key)
		if name, ok := k.check(h); name != want || ok != (want != "") {
			t.Errorf("check(x-api-key: %q) = %q, %v; want %q", key, name, ok, want)
		}
	}
}

func TestLoadAPIKeys_ErrorsNameFileAndLineButNeverTheKey(t *testing.T) {
	cases := []struct{ data, want string }{
		{"alice:sk-secret\nbroken-line\n", "keys:2: want \"name:key\""},
		{":sk-secret\n", "keys:1: empty key name"},
		{"alice:\n", "keys:1: key \"alice\" is empty"},
		{"alice:sk-secret\nalice:sk-other\n", "keys:2: key name \"alice\" already used on line 1"},
		{"alice:sk-secret\n#\nbob:sk-secret\n", "keys:3: key \"bob\" repeats the key of line 1"},
		{"al ice:sk-secret\n", "contains a space"},
		{"alice:sk secret\n", "keys:1: key \"alice\": text after the key that is not a field"},
		{"alice:sk-secret models=\n", "keys:1: key \"alice\": field \"models\" is empty"},
		{"alice:sk-secret models=a,,b\n", "keys:1: key \"alice\": models=a,,b: empty pattern"},
		{"alice:sk-secret role=root\n", "keys:1: key \"alice\": role=root: want \"inference\" or \"admin\""},
		{"alice:sk-secret\nbob:sk-b concurrency=0\n", "keys:2: key \"bob\": concurrency=0: want a whole number from 1 to 100000"},
		{"alice:sk-secret concurrency=1e9\n", "keys:1: key \"alice\": concurrency=1e9"},
		{"alice:sk-secret role=admin role=admin\n", "keys:1: key \"alice\": field \"role\" given twice"},
		{"alice:sk-secret model=x\n", "keys:1: key \"alice\": unknown field \"model\" (want models=, role=, concurrency=, control=, priority=, gpu_hours_per_day= or tokens_per_day=)"},
		{"alice:sk-secret gpu_hours_per_day=0\n", "keys:1: key \"alice\": gpu_hours_per_day=0: want a number of GPU hours above 0"},
		{"alice:sk-secret gpu_hours_per_day=lots\n", "gpu_hours_per_day=lots: want a number"},
		{"alice:sk-secret gpu_hours_per_day=NaN\n", "gpu_hours_per_day=NaN: want a number"},
		{"alice:sk-secret tokens_per_day=1.5\n", "keys:1: key \"alice\": tokens_per_day=1.5: want a whole number"},
		{"alice:sk-secret tokens_per_day=0\n", "tokens_per_day=0: want a whole number"},
		{"ops:sk-secret role=admin tokens_per_day=5\n", "keys:1: key \"ops\": an admin key is never limited"},
		{"alice:sk-secret control=yes\n", "keys:1: key \"alice\": control=yes: want true or false"},
		{"# only comments\n\n", "keys: no keys"},
		{"# only comments\n\n", "keys: no keys"},
	}
	for _, c := range cases {
		_, err := parseAPIKeys("keys", []byte(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.data, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "sk-secret") || strings.Contains(err.Error(), "sk secret") {
			t.Errorf("%q: error %q reveals a key", c.data, err)
		}
	}
	if _, err := LoadAPIKeys(filepath.Join(t.TempDir(), "missing"), priority.DefaultClasses); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v", err)
	}
}

func TestGateway_APIKeys(t *testing.T) {
	keys, err := parseAPIKeys("keys", []byte("alice:sk-alice\nbob:sk-bob\n"))
	if err != nil {
		t.Fatal(err)
	}
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{APIKeys: keys})

	for _, h := range []map[string]string{nil, {"Authorization": "Bearer sk-nope"}, {"Authorization": "sk-bob"}} {
		resp, b := e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, h)
		wantError(t, resp, b, 401, "invalid_api_key")
		if resp.Header.Get("WWW-Authenticate") == "" {
			t.Error("401 without WWW-Authenticate")
		}
	}
	resp, b := e.do("GET", "/v1/models", "", nil)
	wantError(t, resp, b, 401, "invalid_api_key")
	if resp, _ := e.do("GET", "/health", "", nil); resp.StatusCode != 200 {
		t.Errorf("/health needs a key: %d", resp.StatusCode)
	}
	if len(e.models.admitted()) != 0 || len(eng.seen()) != 0 {
		t.Fatal("a request without a valid key went through")
	}

	resp, _ = e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{"Authorization": "Bearer sk-bob"})
	if resp.StatusCode != 200 {
		t.Fatalf("valid key: %d", resp.StatusCode)
	}
	if a := e.models.admitted()[0]; a.Client != "bob" {
		t.Errorf("client label %q, want bob", a.Client)
	}
	if got := eng.seen()[0].header.Get("Authorization"); got != "" {
		t.Errorf("engine got Authorization %q", got)
	}
	e.models.outcome()
}

func TestGateway_CredentialsAndCookiesNeverReachTheEngine(t *testing.T) {
	keys, err := parseAPIKeys("keys", []byte("alice:sk-alice\n"))
	if err != nil {
		t.Fatal(err)
	}
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{APIKeys: keys})
	for _, h := range []map[string]string{
		{"Authorization": "bearer sk-alice", "Cookie": "session=s3cret"},
		{"x-api-key": "sk-alice", "Cookie": "grafana_session=abc"},
	} {
		for _, path := range []string{"/v1/chat/completions", "/upstream/m1/v1/chat/completions"} {
			resp, b := e.do("POST", path, `{"model":"m1"}`, h)
			if resp.StatusCode != 200 {
				t.Fatalf("%s with %v: %d %s", path, h, resp.StatusCode, b)
			}
			e.models.outcome()
		}
	}
	seen := eng.seen()
	if len(seen) != 4 {
		t.Fatalf("engine saw %d requests", len(seen))
	}
	for _, s := range seen {
		for _, name := range []string{"Authorization", "X-Api-Key", "Cookie"} {
			if v := s.header.Get(name); v != "" {
				t.Errorf("engine got %s: %q", name, v)
			}
		}
	}
	if a := e.models.admitted(); a[1].Client != "alice" || a[3].Client != "alice" {
		t.Errorf("x-api-key not accepted as alice's key: %+v", a)
	}

	// Without keys napd checks no credential: the engine's own key passes,
	// cookies still do not.
	eng2 := &okEngine{}
	e2 := newEnv(t, eng2.ServeHTTP, Options{})
	e2.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{"Authorization": "Bearer engine-key", "Cookie": "a=b"})
	e2.models.outcome()
	if s := eng2.seen()[0]; s.header.Get("Authorization") != "Bearer engine-key" || s.header.Get("Cookie") != "" {
		t.Errorf("without keys the engine got Authorization %q, Cookie %q", s.header.Get("Authorization"), s.header.Get("Cookie"))
	}
}

func TestLoadAPIKeys_ScopeFields(t *testing.T) {
	k, err := parseAPIKeys("keys", []byte("plain:sk-1\n"+
		"alice:sk-2  models=llama-*,qwen?,org/* concurrency=4\n"+
		"\tops : sk-3 role=admin\n"+
		"inf:sk-4 role=inference models=m1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := k.Names(); strings.Join(got, " ") != "plain alice ops inf" {
		t.Fatalf("names %v", got)
	}
	plain, alice, ops, inf := k.scope("plain"), k.scope("alice"), k.scope("ops"), k.scope("inf")
	if plain.Models != nil || plain.Role != RoleInference || plain.Concurrency != 0 {
		t.Errorf("a key without fields: %+v, want every model, inference, no limit", plain)
	}
	if strings.Join(alice.Models, " ") != "llama-* qwen? org/*" || alice.Concurrency != 4 || alice.Role != RoleInference {
		t.Errorf("alice %+v", alice)
	}
	if ops.Role != RoleAdmin || ops.Models != nil {
		t.Errorf("ops %+v", ops)
	}
	if inf.Role != RoleInference || len(inf.Models) != 1 {
		t.Errorf("inf %+v", inf)
	}
	for _, c := range []struct {
		requested, model string
		want             bool
	}{
		{"llama-3-8b", "llama-3-8b", true},
		{"fast", "llama-3-8b", true}, // an alias of an allowed model
		{"llama-3-8b", "", true},     // allowed by name even before resolution
		{"qwen2", "qwen2", true},
		{"qwen25", "qwen25", false},
		{"org/deep/model", "org/deep/model", true},
		{"mistral", "mistral", false},
		{"mistral", "", false},
		{"", "", false},
	} {
		if got := alice.MayUse(c.requested, c.model); got != c.want {
			t.Errorf("alice MayUse(%q, %q) = %v, want %v", c.requested, c.model, got, c.want)
		}
	}
	if !plain.MayUse("anything", "") {
		t.Error("a key without models= may not use a model")
	}
}

// priority= names a class of [policy] priorities, resolved when the file
// is loaded (an unknown one is an error naming file, line and key); the
// quota fields are read as written.
func TestLoadAPIKeys_PriorityAndQuotas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	data := "ide:sk-1 priority=interactive\nnightly:sk-2 priority=batch gpu_hours_per_day=2.5 tokens_per_day=1000000\nplain:sk-3\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadAPIKeys(path, priority.DefaultClasses)
	if err != nil {
		t.Fatal(err)
	}
	ide, nightly, plain := k.scope("ide"), k.scope("nightly"), k.scope("plain")
	if ide.Priority != 1 || nightly.Priority != 3 || plain.Priority != priority.None {
		t.Errorf("classes %d %d %d, want 1, 3 and none", ide.Priority, nightly.Priority, plain.Priority)
	}
	if nightly.GPUHoursPerDay != 2.5 || nightly.TokensPerDay != 1000000 || !nightly.Limited() || ide.Limited() {
		t.Errorf("nightly %+v", nightly)
	}
	_, err = LoadAPIKeys(path, priority.Classes{"high", "low"})
	if err == nil || !strings.Contains(err.Error(), path+`:1: key "ide": priority=interactive: unknown priority class "interactive" (want one of high, low)`) {
		t.Errorf("a class not in [policy] priorities: %v", err)
	}
}

func TestAPIKeys_InheritKeepsInFlightCounts(t *testing.T) {
	old, _ := parseAPIKeys("keys", []byte("alice:sk-1 concurrency=1\n"))
	if !old.scope("alice").acquire() {
		t.Fatal("first request refused")
	}
	reloaded, _ := parseAPIKeys("keys", []byte("alice:sk-1 concurrency=1\nbob:sk-2\n"))
	reloaded.Inherit(old)
	if reloaded.scope("alice").acquire() {
		t.Error("a reload reset alice's in-flight count: her second request was admitted")
	}
	old.scope("alice").release() // the request admitted before the reload ends
	if !reloaded.scope("alice").acquire() {
		t.Error("the slot the old request freed is not free")
	}
}

// Scoped keys: a key may use the names its patterns match (a model's own
// name covers its aliases; an alias only itself), on every route, is
// refused others with a 403 that does not tell
// whether they exist, sees only its models in /v1/models, and has at most
// its concurrency in flight (429 beyond).
func TestGateway_ScopedKeys(t *testing.T) {
	keys, err := parseAPIKeys("keys", []byte("open:sk-open\nalias:sk-alias models=a1\nm2only:sk-m2 models=m2 concurrency=1\n"))
	if err != nil {
		t.Fatal(err)
	}
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{APIKeys: keys})
	as := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }
	post := func(key, model string) (*http.Response, []byte) {
		return e.do("POST", "/v1/chat/completions", `{"model":"`+model+`"}`, as(key))
	}

	for _, c := range []struct{ key, model string }{{"sk-open", "m2"}, {"sk-alias", "a1"}, {"sk-m2", "m2"}} {
		if resp, b := post(c.key, c.model); resp.StatusCode != 200 {
			t.Errorf("%s using %s: %d %s", c.key, c.model, resp.StatusCode, b)
		}
		e.models.outcome()
	}
	// Denied: an existing model and a missing one get the same 403.
	var msgs []string
	for _, model := range []string{"m1", "nosuch"} {
		resp, b := post("sk-m2", model)
		wantError(t, resp, b, http.StatusForbidden, "model_not_allowed")
		msgs = append(msgs, strings.ReplaceAll(string(b), model, "X"))
	}
	if msgs[0] != msgs[1] {
		t.Errorf("a denied model's answer tells whether it exists:\n%s\n%s", msgs[0], msgs[1])
	}
	if !strings.Contains(msgs[0], "m2") {
		t.Errorf("the 403 does not name the rule: %s", msgs[0])
	}
	resp, b := post("sk-alias", "m1")
	wantError(t, resp, b, http.StatusForbidden, "model_not_allowed")
	resp, b = e.do("GET", "/upstream/m1/v1/models", "", as("sk-m2"))
	wantError(t, resp, b, http.StatusForbidden, "model_not_allowed")
	resp, b = e.do("GET", "/v1/models/a1", "", as("sk-m2"))
	wantError(t, resp, b, http.StatusForbidden, "model_not_allowed")
	if resp, _ := e.do("GET", "/v1/models/a1", "", as("sk-alias")); resp.StatusCode != 200 {
		t.Errorf("GET /v1/models/a1 for the alias key: %d", resp.StatusCode)
	}
	for key, want := range map[string]string{"sk-open": "m1 m2", "sk-alias": "m1", "sk-m2": "m2"} {
		_, b := e.do("GET", "/v1/models", "", as(key))
		var list modelList
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		if got := strings.Join(ids, " "); got != want {
			t.Errorf("%s lists %q, want %q", key, got, want)
		}
	}
	// A dedicated socket checks the key's models too.
	ded := serveGateway(t, e.gw.ModelHandler("m1"), nil)
	req, _ := http.NewRequest("POST", ded.URL+"/v1/completions", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer sk-m2")
	if resp, err := e.client.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("dedicated socket of m1 for the m2 key: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}

	// The per-key limit: one request of m2only in flight, the next is 429.
	hold, entered := make(chan struct{}), make(chan struct{}, 1)
	e.models.admit = func(ctx context.Context, a lease.Request) (*Ticket, error) {
		if a.Client == "m2only" {
			entered <- struct{}{}
			<-hold
		}
		return e.models.ticket(0), nil
	}
	first := make(chan int)
	go func() {
		resp, _ := post("sk-m2", "m2")
		first <- resp.StatusCode
	}()
	<-entered
	resp, b = post("sk-m2", "m2")
	wantError(t, resp, b, http.StatusTooManyRequests, "key_concurrency_limit")
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if resp, _ := post("sk-open", "m2"); resp.StatusCode != 200 {
		t.Errorf("another key is limited by m2only's limit: %d", resp.StatusCode)
	}
	e.models.outcome()
	close(hold)
	if s := <-first; s != 200 {
		t.Errorf("first request: %d", s)
	}
	e.models.outcome()
	if resp, _ := post("sk-m2", "m2"); resp.StatusCode != 200 {
		t.Errorf("after the first ended: %d", resp.StatusCode)
	}
	e.models.outcome()
}
