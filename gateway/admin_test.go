package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// adminStub stands in for the agent's admin handler.
var adminStub = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Admin", "yes")
	_, _ = w.Write([]byte("admin " + r.URL.Path))
})

func TestGateway_AdminNeedsAnAdminKey(t *testing.T) {
	keys, err := parseAPIKeys("keys", []byte("ops:sk-ops role=admin\nalice:sk-alice\n"))
	if err != nil {
		t.Fatal(err)
	}
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{APIKeys: keys, Admin: adminStub})

	resp, b := e.do("GET", "/napd/v1/status", "", map[string]string{"Authorization": "Bearer sk-ops"})
	if resp.StatusCode != 200 || string(b) != "admin /napd/v1/status" {
		t.Errorf("admin key: %d %s", resp.StatusCode, b)
	}
	resp, b = e.do("GET", "/napd/v1/status", "", map[string]string{"x-api-key": "sk-ops"})
	if resp.StatusCode != 200 {
		t.Errorf("admin key as x-api-key: %d %s", resp.StatusCode, b)
	}
	resp, b = e.do("POST", "/napd/v1/models/m1/sleep", "", map[string]string{"Authorization": "Bearer sk-alice"})
	wantError(t, resp, b, http.StatusForbidden, "admin_only")
	if !strings.Contains(string(b), "role=admin") {
		t.Errorf("403 does not name the rule: %s", b)
	}
	resp, b = e.do("GET", "/napd/", "", nil)
	wantError(t, resp, b, http.StatusUnauthorized, "invalid_api_key")
	if !strings.Contains(strings.Join(resp.Header.Values("WWW-Authenticate"), "|"), "Basic") {
		t.Errorf("no Basic challenge for a browser: %v", resp.Header.Values("WWW-Authenticate"))
	}
	// A browser answers the challenge with the key as password.
	req, _ := http.NewRequest("GET", e.srv.URL+"/napd/", nil)
	req.SetBasicAuth("anyone", "sk-ops")
	if resp, err := e.client.Do(req); err != nil || resp.StatusCode != 200 || resp.Header.Get("X-Admin") != "yes" {
		t.Errorf("Basic with the admin key: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	req.SetBasicAuth("anyone", "sk-alice")
	if resp, err := e.client.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("Basic with an inference key: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Basic is for /napd/ only.
	req, _ = http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m1"}`))
	req.SetBasicAuth("anyone", "sk-ops")
	if resp, err := e.client.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("Basic on /v1: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if len(eng.seen()) != 0 {
		t.Error("an admin request reached the engine")
	}
}

func TestGateway_AdminWithoutKeysIsLoopbackOnly(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{Admin: adminStub})
	if resp, b := e.do("GET", "/napd/", "", nil); resp.StatusCode != 200 || string(b) != "admin /napd/" {
		t.Errorf("loopback client: %d %s", resp.StatusCode, b)
	}
	resp, _ := e.client.Do(mustRequest(t, "GET", e.srv.URL+"/napd"))
	if resp.StatusCode != 200 || resp.Request.URL.Path != "/napd/" {
		t.Errorf("/napd: %d, ended at %s", resp.StatusCode, resp.Request.URL.Path)
	}
	resp.Body.Close()
	for _, remote := range []string{"192.0.2.7:40000", "[2001:db8::1]:40000", "@", ""} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/napd/v1/status", nil)
		req.RemoteAddr = remote
		e.gw.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "admin_loopback_only") {
			t.Errorf("from %q: %d %s", remote, rec.Code, rec.Body.String())
		}
	}
	for _, remote := range []string{"127.0.0.1:1", "[::1]:1", "127.8.9.10:1"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/napd/v1/status", nil)
		req.RemoteAddr = remote
		e.gw.Handler().ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Errorf("from %q: %d", remote, rec.Code)
		}
	}
	// A model's dedicated socket sends /napd/ to its engine like any path.
	rec := httptest.NewRecorder()
	e.gw.ModelHandler("m1").ServeHTTP(rec, httptest.NewRequest("GET", "/napd/", nil))
	if rec.Header().Get("X-Admin") != "" {
		t.Error("a dedicated socket served the admin handler")
	}
	e.models.outcome()
	// Without an admin handler /napd/ does not exist.
	e2 := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	resp, b := e2.do("GET", "/napd/", "", nil)
	wantError(t, resp, b, http.StatusNotFound, "not_found")
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
