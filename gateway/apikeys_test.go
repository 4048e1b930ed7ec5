package gateway

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadAPIKeys_ParsesNamesAndKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	data := "# napd keys\n\nalice: sk-alice\n  bob:sk:with:colons  \n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadAPIKeys(path)
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
		{"alice:sk secret\n", "keys:1: key \"alice\" contains a space"},
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
	if _, err := LoadAPIKeys(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
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
