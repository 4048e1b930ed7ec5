package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

func FuzzParseAPIKeys(f *testing.F) {
	f.Add([]byte("alice:sk-1\nbob:sk-2\n"))
	f.Add([]byte("# c\n\n a : b:c \n"))
	f.Add([]byte("x:y\nx:z\n"))
	f.Add([]byte(":\n"))
	f.Add([]byte("a:k models=x*,y? role=admin concurrency=3\nb:j role=inference\n"))
	f.Add([]byte("a:k models=,\n"))
	f.Add([]byte("a:k priority=batch gpu_hours_per_day=0.5 tokens_per_day=10\nb:j role=admin priority=x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := parseAPIKeys("f", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f:") {
				t.Errorf("error %q does not name the file", err)
			}
			return
		}
		// Every parsed line's key must authenticate as its own name, with
		// a valid scope.
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || line[0] == '#' {
				continue
			}
			name, rest, _ := strings.Cut(line, ":")
			got, ok := k.check(http.Header{"Authorization": {"Bearer " + strings.Fields(rest)[0]}})
			if !ok || got != strings.TrimSpace(name) {
				t.Errorf("key of %q authenticates as %q, %v", name, got, ok)
			}
			s := k.scope(got)
			if s == nil || (s.Role != RoleInference && s.Role != RoleAdmin) || s.Concurrency < 0 || s.Concurrency > maxKeyConcurrency ||
				s.GPUHoursPerDay < 0 || s.GPUHoursPerDay > maxGPUHours || s.TokensPerDay < 0 || s.TokensPerDay > maxTokens ||
				(s.Role == RoleAdmin && s.Limited()) {
				t.Errorf("key %q has scope %+v", got, s)
			}
			for _, p := range s.Models {
				if p == "" || strings.ContainsAny(p, ", \t") {
					t.Errorf("key %q: pattern %q", got, p)
				}
			}
		}
	})
}

// FuzzSetPriority: a JSON object comes out valid, with every top-level
// priority napd's and nothing else changed; anything else comes out as it
// went in.
func FuzzSetPriority(f *testing.F) {
	for _, s := range []string{`{}`, ` { } `, `{"model":"m"}`, `{"priority":1,"priority":2}`, `{"x":{"priority":1}}`,
		`[]`, `null`, `{"a":1} x`, `{"a":"}"}`, "{\"priority\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out := setPriority(body, 7)
		var in map[string]json.RawMessage
		if _, ok := valueSpans(body, 0, "priority", "", nil); !ok {
			if !bytes.Equal(out, body) {
				t.Fatalf("%q is no JSON object, yet came out as %q", body, out)
			}
			return
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return // valueSpans is the engines' reading; Unmarshal may differ on odd input
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q came out as %q, not JSON: %v", body, out, err)
		}
		if string(got["priority"]) != "7" {
			t.Fatalf("%q came out with priority %s", body, got["priority"])
		}
		delete(in, "priority")
		delete(got, "priority")
		if !reflect.DeepEqual(in, got) {
			t.Fatalf("%q: the other members changed: %q", body, out)
		}
	})
}

func FuzzParseTimeout(f *testing.F) {
	for _, s := range []string{"30", "30s", "1m30s", "0.5", "-1", "0", "NaN", "Inf", "1e300", "soon", "1h", "1e-10", "0.0000001"} {
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
	for _, s := range []string{`{"model":"m","stream":true}`, `{"model":1}`, `null`, `[]`, `{"stream":"yes"}`, `{"model":"\u00e9"}`, `{"Model":"a","model":"b"}`, `{"mod\u0065l":"m"}`,
		` {"stream" : null , "model":null} `, `{"ſtream":true}`, "{\"model\":\"a\xffb\"}", `{"model":"a\"b"}`,
		`{"model":1,"MODEL":2}`, `{"Stream":1,"Model":2}`, `{"x":{"model":1},"stream":false}`, `{"model":"m"} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fields, err := parseBody(body)
		want, wantErr := decodeBody(body)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || errors.Is(err, errAmbiguous) != errors.Is(wantErr, errAmbiguous) {
			t.Fatalf("parseBody(%q): error %v, want %v", body, err, wantErr)
		}
		if err == nil && fields != want {
			t.Fatalf("parseBody(%q) = %+v, want %+v", body, fields, want)
		}
		if err != nil {
			if keys, ok := topLevelKeys(body); ok && plainRouting(body, keys) {
				t.Errorf("parseBody refused %q: %v", body, err)
			}
			return
		}
		// What the gateway found must be what the engine finds: exact keys,
		// none repeated in any case.
		var full map[string]any
		if json.Unmarshal(body, &full) != nil || full == nil {
			t.Fatalf("parseBody accepted %q, which is not a JSON object", body)
		}
		for k := range full {
			if (strings.EqualFold(k, "model") && k != "model") || (strings.EqualFold(k, "stream") && k != "stream") {
				t.Errorf("case variant %q accepted", k)
			}
		}
		if m, ok := full["model"].(string); ok && m != fields.Model {
			t.Errorf("model %q, full decode %q", fields.Model, m)
		}
		if s, ok := full["stream"].(bool); ok && s != fields.Stream {
			t.Errorf("stream %v, full decode %v", fields.Stream, s)
		}
	})
}

// decodeBody is parseBody done with encoding/json alone: every key and
// routing value decoded, the spellings kept in a map.
func decodeBody(body []byte) (requestFields, error) {
	var f requestFields
	if !json.Valid(body) {
		var v any
		return f, json.Unmarshal(body, &v)
	}
	keys, vals, ok := topLevel(body)
	if !ok {
		return f, errors.New("want a JSON object")
	}
	seen := map[string]string{}
	for i, key := range keys {
		folded := ""
		for _, name := range []string{"model", "stream"} {
			if strings.EqualFold(key, name) {
				folded = name
			}
		}
		if folded == "" {
			continue
		}
		if prev, dup := seen[folded]; dup {
			return f, fmt.Errorf("%w: %q and %q both given", errAmbiguous, prev, key)
		}
		seen[folded] = key
		var err error
		switch key {
		case "model":
			err = json.Unmarshal(vals[i], &f.Model)
		case "stream":
			err = json.Unmarshal(vals[i], &f.Stream)
		}
		if err != nil {
			return f, err
		}
	}
	for _, folded := range []string{"model", "stream"} {
		if spelling, ok := seen[folded]; ok && spelling != folded {
			return f, fmt.Errorf("%w: %q is not %q (keys are case-sensitive)", errAmbiguous, spelling, folded)
		}
	}
	return f, nil
}

// topLevelKeys lists the keys of a JSON object body in order, repeats
// included.
func topLevelKeys(body []byte) ([]string, bool) {
	keys, _, ok := topLevel(body)
	return keys, ok
}

// topLevel lists the keys of a JSON object body and their values in
// order, repeats included (a reference walk with encoding/json's
// tokenizer).
func topLevel(body []byte) ([]string, []json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, false
	}
	var keys []string
	var vals []json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, false
		}
		keys = append(keys, t.(string))
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return nil, nil, false
		}
		vals = append(vals, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, false
	}
	return keys, vals, true
}

// plainRouting reports a body parseBody must accept: model a string (or
// null, or absent) and stream a bool (or null, or absent), each spelled
// once and exactly.
func plainRouting(body []byte, keys []string) bool {
	n := map[string]int{}
	for _, k := range keys {
		for _, name := range []string{"model", "stream"} {
			if strings.EqualFold(k, name) {
				if k != name {
					return false
				}
				n[name]++
			}
		}
	}
	if n["model"] > 1 || n["stream"] > 1 {
		return false
	}
	var typed struct {
		Model  *string `json:"model"`
		Stream *bool   `json:"stream"`
	}
	return json.Unmarshal(body, &typed) == nil
}

// FuzzRequestHead feeds raw HTTP/1.1 requests through the gateway's
// handler: the header parsing that decides routing (path, upstream model,
// deny list), the deadline (X-Request-Timeout) and idempotency
// (Idempotency-Key, fingerprint), plus the credential check. Whatever the
// input, no engine control path and no credential reaches the engine, an
// admitted request has a deadline within request_timeout, and a keyed
// request carries a fingerprint.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\nContent-Length: 15\r\n\r\n{\"model\":\"m1\"}",
		"POST /upstream/m1/sleep HTTP/1.1\r\nHost: x\r\nx-api-key: sk-a\r\n\r\n",
		"POST /upstream/m1/%2e%2e/%73leep HTTP/1.1\r\nHost: x\r\nAuthorization: bearer sk-a\r\n\r\n",
		"GET /upstream/a1//wake_up/ HTTP/1.1\r\nHost: x\r\nAuthorization: BEARER sk-a\r\nCookie: a=b\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\nX-Request-Timeout: 1e-10\r\nIdempotency-Key: k\r\nContent-Length: 15\r\n\r\n{\"model\":\"m2\"}",
		"POST /upstream/m2/v1/x?y=1 HTTP/1.1\r\nHost: x\r\nx-api-key: sk-a\r\nX-Request-Timeout: 2.5\r\nIdempotency-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	keys, err := parseAPIKeys("keys", []byte("a:sk-a\n"))
	if err != nil {
		f.Fatal(err)
	}
	const budget = time.Minute
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return
		}
		models := newFakeModels(t, "http://engine.invalid")
		var sent []*http.Request
		models.transport = roundTripFunc(func(out *http.Request) (*http.Response, error) {
			dl, ok := out.Context().Deadline()
			if !ok || time.Until(dl) > budget {
				t.Errorf("engine request with deadline %v (set %v), want within %v", dl, ok, budget)
			}
			sent = append(sent, out)
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: out}, nil
		})
		gw := New(Options{APIKeys: keys, RequestTimeout: budget, MaxBody: 1 << 16, Logger: slog.New(slog.DiscardHandler)}, models)
		req.RemoteAddr = "127.0.0.1:1"
		rec := httptest.NewRecorder()
		func() {
			defer func() {
				if v := recover(); v != nil && v != http.ErrAbortHandler {
					panic(v)
				}
			}()
			gw.Handler().ServeHTTP(rec, req)
		}()
		for _, a := range models.admitted() {
			if (a.IdempotencyKey != "") != (a.Fingerprint != "") {
				t.Errorf("admission %+v: key and fingerprint disagree", a)
			}
		}
		for _, out := range sent {
			if gw.rules.Refused(out.Method, out.URL.Path) {
				t.Errorf("control path %s %q reached the engine", out.Method, out.URL.Path)
			}
			for _, h := range []string{"Authorization", "X-Api-Key", "Cookie"} {
				if out.Header.Get(h) != "" {
					t.Errorf("%s reached the engine", h)
				}
			}
		}
		if rec.Code >= 400 && !json.Valid(rec.Body.Bytes()) {
			t.Errorf("status %d with a body that is not JSON: %q", rec.Code, rec.Body.Bytes())
		}
	})
}

func TestParseTimeout(t *testing.T) {
	for s, want := range map[string]time.Duration{"30": 30 * time.Second, "2.5": 2500 * time.Millisecond, "90s": 90 * time.Second, "1m30s": 90 * time.Second} {
		if d, err := parseTimeout(s); err != nil || d != want {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v", s, d, err, want)
		}
	}
	for _, s := range []string{"", "0", "-1", "0s", "-3s", "NaN", "soon", "30 s", "1e-10", "0.0000001e-3", "0.1ns"} {
		if _, err := parseTimeout(s); err == nil {
			t.Errorf("parseTimeout(%q) accepted", s)
		}
	}
}

// FuzzValidJSON: validJSON is json.Valid.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,-2.5e+3,true,false,null,"x\u00e9\n"]}`, ` [ ] `, `{}`, `01`, `1.`, `-`, `1e`, `"\x"`,
		"\"\x01\"", "\"\xff\"", `{"a":1,}`, `[1,]`, `{"a" 1}`, `[1 2]`, `{"a":{"b":[{}]}}x`, `"\u12"`, `nul`, ``, "\ufeff{}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid %v", b, got, want)
		}
	})
}

func TestValidJSONDepth(t *testing.T) {
	for _, n := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			b := []byte(strings.Repeat(open, n) + "1" + strings.Repeat(close, n))
			if got, want := validJSON(b), json.Valid(b); got != want {
				t.Errorf("%d deep %s: validJSON %v, json.Valid %v", n, open, got, want)
			}
		}
	}
}

// BenchmarkParseBody: a small request and a long prompt.
func BenchmarkParseBody(b *testing.B) {
	for _, c := range []struct{ name, body string }{
		{"small", smallBody},
		{"prompt-90k", `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat(`Hello, \"world\". `, 5000) + `"}],"stream":true}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(c.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseBody(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
