package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/priority"
	"github.com/napd/napd/request"
)

var llamaRoutes = []Route{{"POST", "/completion"}, {"POST", "/tokenize"}, {"GET", "/props"}}

func TestGateway_RoutesOutsideV1(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{Routes: llamaRoutes})
	resp, b := e.do("POST", "/completion", `{"model":"a1","prompt":"hi"}`, nil)
	if resp.StatusCode != 200 || string(b) != `{"ok":true}` {
		t.Fatalf("POST /completion: %d %s", resp.StatusCode, b)
	}
	e.models.outcome()
	resp, b = e.do("GET", "/props?model=m2&x=1", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /props: %d %s", resp.StatusCode, b)
	}
	e.models.outcome()
	s := eng.seen()
	if len(s) != 2 || s[0].path != "/completion" || string(s[0].body) != `{"model":"a1","prompt":"hi"}` ||
		s[1].method != "GET" || s[1].path != "/props" || s[1].query != "model=m2&x=1" {
		t.Errorf("engine saw %+v", s)
	}
	if a := e.models.admitted(); len(a) != 2 || a[0].Model != "m1" || a[0].Kind != request.Completion || a[1].Model != "m2" {
		t.Errorf("admissions %+v", a)
	}

	resp, b = e.do("GET", "/props", "", nil)
	wantError(t, resp, b, 400, "missing_model")
	resp, b = e.do("GET", "/props?model=nope", "", nil)
	wantError(t, resp, b, 404, "model_not_found")
	resp, b = e.do("POST", "/props", `{"model":"m1"}`, nil)
	wantError(t, resp, b, 405, "method_not_allowed")
	resp, b = e.do("POST", "/completion", `{"prompt":"x"}`, nil)
	wantError(t, resp, b, 400, "missing_model")
	resp, b = e.do("POST", "/slots", `{"model":"m1"}`, nil)
	wantError(t, resp, b, 404, "not_found")
	if len(eng.seen()) != 2 {
		t.Errorf("the engine saw refused requests")
	}
}

// renamingEngine answers as an engine that knows its model as "engine-name":
// JSON or, for stream requests, SSE chunks with the model at the top level
// and in Anthropic's message_start.
func renamingEngine(seen chan<- string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- r.URL.RawQuery + " " + string(b)
		if strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"engine-name\",\"id\":\"x\"}}\n\n")
			io.WriteString(w, "data: {\"model\":\"engine-name\",\"choices\":[{\"delta\":{\"content\":\"model engine-name\"}}]}\r\n\r\n")
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"id":"c1", "model" : "engine-name","text":"engine-name","other":{"model":"engine-name"}}`)
	}
}

func TestGateway_ServedNameRoundTrip(t *testing.T) {
	seen := make(chan string, 10)
	e := newEnv(t, renamingEngine(seen), Options{Routes: llamaRoutes})
	e.models.served = "engine-name"

	resp, b := e.do("POST", "/v1/chat/completions", `{"model": "a1", "messages":[]}`, map[string]string{"Accept-Encoding": "gzip"})
	if got := <-seen; got != ` {"model": "engine-name", "messages":[]}` {
		t.Errorf("engine saw %q", got)
	}
	// Only the answer's own model is mapped: text and other objects keep theirs.
	want := `{"id":"c1", "model" : "a1","text":"engine-name","other":{"model":"engine-name"}}`
	if resp.StatusCode != 200 || string(b) != want || resp.ContentLength != int64(len(want)) {
		t.Errorf("answer %d %q (length %d), want %q", resp.StatusCode, b, resp.ContentLength, want)
	}
	e.models.outcome()

	resp, b = e.do("POST", "/v1/messages", `{"model":"m1","stream":true}`, nil)
	<-seen
	wantSSE := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m1\",\"id\":\"x\"}}\n\n" +
		"data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"model engine-name\"}}]}\r\n\r\n" +
		"data: [DONE]\n\n"
	if resp.StatusCode != 200 || string(b) != wantSSE {
		t.Errorf("stream %d:\n%q\nwant\n%q", resp.StatusCode, b, wantSSE)
	}
	e.models.outcome()

	resp, _ = e.do("GET", "/props?model=a1", "", nil)
	if got := <-seen; resp.StatusCode != 200 || got != "model=engine-name " {
		t.Errorf("GET by query: engine saw %q", got)
	}
	e.models.outcome()

	// Pass-through routes are never rewritten.
	e.do("POST", "/upstream/m1/v1/chat/completions", `{"model":"m1"}`, nil)
	if got := <-seen; got != ` {"model":"m1"}` {
		t.Errorf("upstream: engine saw %q", got)
	}
}

func TestMapModel(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"model":"s"}`, `{"model":"r"}`},
		{`{"model":"other"}`, `{"model":"other"}`},
		{`{"model":"\u0073"}`, `{"model":"r"}`},
		{`{"a":[{"model":"s"}],"message":{"model":"s"}}`, `{"a":[{"model":"s"}],"message":{"model":"r"}}`},
		{`{"Model":"s"}`, `{"Model":"s"}`},
		{`not json`, `not json`},
		{`{"model":"s"`, `{"model":"s"`},
		{`[{"model":"s"}]`, `[{"model":"s"}]`},
	}
	for _, c := range cases {
		if got := string(mapModel([]byte(c.in), "s", "r")); got != c.want {
			t.Errorf("mapModel(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	if got := string(setModel([]byte(`{"model":"a","x":{"model":"a"},"model":"b"}`), "s")); got != `{"model":"s","x":{"model":"a"},"model":"s"}` {
		t.Errorf("setModel: %s", got)
	}
}

type listedModel struct {
	ID   string
	Napd struct {
		State   string
		Aliases []string
		AliasOf *string `json:"alias_of"`
		Weights int64   `json:"weights_bytes"`
		// Resident is nil for a model without weight files.
		Resident *int64 `json:"weights_resident_bytes"`
	}
}

func listModels(t *testing.T, e *env, path string) []listedModel {
	t.Helper()
	resp, b := e.do("GET", path, "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	var list struct{ Data []listedModel }
	if strings.HasPrefix(path, "/v1/models/") {
		var one listedModel
		if err := json.Unmarshal(b, &one); err != nil {
			t.Fatal(err)
		}
		return []listedModel{one}
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	return list.Data
}

func TestGateway_AliasesListed(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{ListAliases: true})
	var ids []string
	data := listModels(t, e, "/v1/models")
	for _, m := range data {
		ids = append(ids, m.ID)
	}
	if !reflect.DeepEqual(ids, []string{"m1", "a1", "m2"}) {
		t.Fatalf("ids %v", ids)
	}
	a1 := data[1]
	if a1.Napd.AliasOf == nil || *a1.Napd.AliasOf != "m1" || a1.Napd.State != "awake" || a1.Napd.Aliases == nil {
		t.Errorf("alias entry %+v", a1)
	}
	if data[0].Napd.AliasOf != nil {
		t.Errorf("model entry has alias_of")
	}
	if m1, m2 := data[0].Napd, data[2].Napd; m1.Weights != 8<<30 || m1.Resident == nil || *m1.Resident != 2<<30 || m2.Resident != nil {
		t.Errorf("weights: m1 %d resident %v, m2 resident %v; want 8 GiB, 2 GiB, none", m1.Weights, m1.Resident, m2.Resident)
	}
	if one := listModels(t, e, "/v1/models/a1")[0]; one.ID != "a1" || *one.Napd.AliasOf != "m1" {
		t.Errorf("/v1/models/a1: %+v", one)
	}

	off := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	if data := listModels(t, off, "/v1/models"); len(data) != 2 {
		t.Errorf("list_aliases off: %d entries", len(data))
	}
	if one := listModels(t, off, "/v1/models/a1")[0]; one.ID != "m1" || one.Napd.AliasOf != nil {
		t.Errorf("list_aliases off, /v1/models/a1: %+v", one)
	}
}

// A model with listed = false is left out of every model list, its
// aliases too, and still served and described by name.
func TestGateway_UnlistedModel(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{ListAliases: true})
	e.models.mu.Lock()
	e.models.unlisted = "m1"
	e.models.mu.Unlock()
	for _, path := range []string{"/v1/models", "/models"} {
		var ids []string
		for _, m := range listModels(t, e, path) {
			ids = append(ids, m.ID)
		}
		if !reflect.DeepEqual(ids, []string{"m2"}) {
			t.Errorf("%s lists %v, want [m2]", path, ids)
		}
	}
	if one := listModels(t, e, "/v1/models/m1"); len(one) != 1 || one[0].ID != "m1" {
		t.Errorf("/v1/models/m1: %+v", one)
	}
	resp, b := e.do("POST", "/v1/chat/completions", `{"model":"a1"}`, nil)
	if resp.StatusCode != 200 {
		t.Errorf("unlisted model by its alias: %d %s", resp.StatusCode, b)
	}
}

func TestGateway_CORS(t *testing.T) {
	engine := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*") // as vLLM does by default
		w.Write([]byte(`{}`))
	}
	e := newEnv(t, engine, Options{CORSOrigins: []string{"https://chat.example"}, APIKeys: mustKeys(t, "alice:sk-1")})
	preflight := map[string]string{"Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
	resp, b := e.do("OPTIONS", "/v1/chat/completions", "", preflight)
	h := resp.Header
	if resp.StatusCode != 204 || h.Get("Access-Control-Allow-Origin") != "https://chat.example" ||
		h.Get("Access-Control-Allow-Methods") != "POST" || h.Get("Access-Control-Allow-Headers") != preflight["Access-Control-Request-Headers"] ||
		h.Get("Access-Control-Max-Age") == "" || !strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
		t.Errorf("allowed preflight: %d %v %s", resp.StatusCode, h, b)
	}

	preflight["Origin"] = "https://evil.example"
	resp, b = e.do("OPTIONS", "/v1/chat/completions", "", preflight)
	wantError(t, resp, b, 403, "origin_not_allowed")
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("refused preflight carries Access-Control-Allow-Origin")
	}

	auth := map[string]string{"Origin": "https://chat.example", "Authorization": "Bearer sk-1"}
	resp, _ = e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, auth)
	if got := resp.Header.Values("Access-Control-Allow-Origin"); resp.StatusCode != 200 || !reflect.DeepEqual(got, []string{"https://chat.example"}) ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "X-Queue-Depth") {
		t.Errorf("answer to an allowed origin: %d, Allow-Origin %q, Expose %q", resp.StatusCode, got, resp.Header.Get("Access-Control-Expose-Headers"))
	}
	e.models.outcome()
	auth["Origin"] = "https://evil.example"
	resp, b = e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{"Origin": "https://evil.example"})
	wantError(t, resp, b, 401, "invalid_api_key")
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("answer to another origin carries Access-Control-Allow-Origin")
	}

	// Without cors_origins: no preflight answered, no CORS headers added.
	off := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	preflight["Origin"] = "https://chat.example"
	resp, b = off.do("OPTIONS", "/v1/chat/completions", "", preflight)
	wantError(t, resp, b, 405, "method_not_allowed")
	if resp.Header.Get("Access-Control-Allow-Origin") != "" || resp.Header.Get("Vary") != "" {
		t.Errorf("CORS headers without cors_origins: %v", resp.Header)
	}
}

func mustKeys(t *testing.T, lines string) *APIKeys {
	t.Helper()
	k, err := parseAPIKeys("keys", []byte(lines))
	if err == nil {
		err = k.resolveClasses("keys", priority.DefaultClasses)
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// wantAnthropicError asserts an error in Anthropic's shape.
func wantAnthropicError(t *testing.T, resp *http.Response, body []byte, status int, typ string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	var e struct {
		Type  string
		Error *struct{ Type, Message string }
		ID    string `json:"request_id"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	if e.Type != "error" || e.Error.Type != typ || e.Error.Message == "" || !strings.HasPrefix(e.ID, "req_") || resp.Header.Get("Request-Id") != e.ID {
		t.Errorf("error %s (request-id header %q), want type %q", body, resp.Header.Get("Request-Id"), typ)
	}
}

func TestGateway_AnthropicRoutesAnswerAnthropicErrors(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{MaxBody: 100, APIKeys: mustKeys(t, "alice:sk-1")})
	key := map[string]string{"Authorization": "Bearer sk-1"}
	cases := []struct {
		path, body string
		header     map[string]string
		status     int
		typ        string
	}{
		{"/v1/messages", `{"model":"m1"}`, nil, 401, "authentication_error"},
		{"/v1/messages", `{"model":"nope"}`, key, 404, "not_found_error"},
		{"/v1/messages", `{"max_tokens":1}`, key, 400, "invalid_request_error"},
		{"/v1/messages/count_tokens", `{"model":"m1","x":"` + strings.Repeat("a", 100) + `"}`, key, 413, "request_too_large"},
	}
	for _, c := range cases {
		resp, b := e.do("POST", c.path, c.body, c.header)
		wantAnthropicError(t, resp, b, c.status, c.typ)
	}
	resp, b := e.do("GET", "/v1/messages", "", key)
	wantAnthropicError(t, resp, b, 405, "invalid_request_error")

	e.models.admit = func(context.Context, lease.Request) (*Ticket, error) {
		return nil, &Refusal{Code: "queue_full", Message: "queue full", RetryAfter: time.Second}
	}
	resp, b = e.do("POST", "/v1/messages", `{"model":"m1"}`, key)
	wantAnthropicError(t, resp, b, 503, "overloaded_error")
	if resp.Header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	// The OpenAI routes keep OpenAI's shape.
	resp, b = e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, nil)
	wantError(t, resp, b, 401, "invalid_api_key")
	if len(eng.seen()) != 0 {
		t.Error("the engine saw refused requests")
	}
}

// FuzzMapModel: mapping keeps a document's validity and changes nothing
// but the top-level (or message's) model that named the served name.
func FuzzMapModel(f *testing.F) {
	for _, s := range []string{`{"model":"s"}`, `{"message":{"model":"s"},"x":[1,{"model":"s"}]}`, `{"model":"\u0073","model":1}`, `[1]`, `{"a":`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		out := mapModel(doc, "s", "r")
		if json.Valid(doc) != json.Valid(out) {
			t.Fatalf("validity changed: %q -> %q", doc, out)
		}
		var in, got map[string]any
		if json.Unmarshal(doc, &in) != nil {
			if !bytes.Equal(out, doc) {
				t.Fatalf("a non-object was changed: %q -> %q", doc, out)
			}
			return
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if in["model"] == "s" {
			in["model"] = "r"
		}
		if m, ok := in["message"].(map[string]any); ok && m["model"] == "s" {
			m["model"] = "r"
		}
		if !reflect.DeepEqual(in, got) {
			t.Fatalf("%q -> %q", doc, out)
		}
		set := setModel(doc, "n")
		if err := json.Unmarshal(set, &got); err != nil || (in["model"] != nil && got["model"] != "n") {
			t.Fatalf("setModel %q -> %q", doc, set)
		}
	})
}
