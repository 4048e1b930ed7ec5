package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/priority"
)

// The gateway hands the model the key's class and the class the request
// asks for (the model resolves them: a request may lower its class, never
// raise it); a name that is no class is a 400; the answer names the class
// the request ran in.
func TestGateway_PriorityHeaderAndKeyClass(t *testing.T) {
	keys := mustKeys(t, "ide:sk-ide priority=interactive\nplain:sk-plain\n")
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{APIKeys: keys})
	e.models.admit = func(_ context.Context, a lease.Request) (*Ticket, error) {
		tk := e.models.ticket(0)
		tk.Class = priority.Resolve(a.Priority, a.Asked, 2)
		return tk, nil
	}
	post := func(key, class string) (*http.Response, []byte) {
		h := map[string]string{"Authorization": "Bearer " + key}
		if class != "" {
			h[HeaderPriority] = class
		}
		return e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, h)
	}
	for _, c := range []struct {
		key, asked       string
		priority, askedC priority.Class
		ran              string
	}{
		{"sk-ide", "", 1, priority.None, "interactive"},
		{"sk-ide", "batch", 1, 3, "batch"},
		{"sk-plain", "", priority.None, priority.None, "default"},
		{"sk-plain", "interactive", priority.None, 1, "default"}, // not above the model's default
	} {
		resp, b := post(c.key, c.asked)
		e.models.outcome()
		if resp.StatusCode != 200 {
			t.Fatalf("%s asking %q: %d %s", c.key, c.asked, resp.StatusCode, b)
		}
		got := e.models.admitted()
		a := got[len(got)-1]
		if a.Priority != c.priority || a.Asked != c.askedC {
			t.Errorf("%s asking %q: admitted with key class %d, asked %d; want %d, %d", c.key, c.asked, a.Priority, a.Asked, c.priority, c.askedC)
		}
		if h := resp.Header.Get(HeaderPriority); h != c.ran {
			t.Errorf("%s asking %q: %s %q, want %q", c.key, c.asked, HeaderPriority, h, c.ran)
		}
	}
	for _, s := range eng.seen() {
		if h := s.header.Get(HeaderPriority); h != "" {
			t.Errorf("the engine saw %s %q: it is napd's", HeaderPriority, h)
		}
	}
	resp, b := post("sk-ide", "urgent")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"code":"invalid_priority"`) ||
		!strings.Contains(string(b), "interactive, default, batch") {
		t.Errorf("an unknown class: %d %s", resp.StatusCode, b)
	}
}

// engine_priority: the engine's body carries napd's priority for the
// request's class (its place counted from 0), replacing the client's;
// without it the body passes byte for byte.
func TestGateway_EnginePriorityField(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	var engine bool
	e.models.admit = func(context.Context, lease.Request) (*Ticket, error) {
		tk := e.models.ticket(0)
		tk.Class, tk.EnginePriority = 3, engine
		return tk, nil
	}
	send := func(body string) string {
		resp, b := e.do("POST", "/v1/chat/completions", body, nil)
		e.models.outcome()
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		s := eng.seen()
		return string(s[len(s)-1].body)
	}
	plain := `{"model":"m1","priority":0,"messages":[]}`
	if got := send(plain); got != plain {
		t.Errorf("without engine_priority the engine got %s, want the body as sent", got)
	}
	engine = true
	for body, want := range map[string]string{
		`{"model":"m1"}`:                              `{"priority":2,"model":"m1"}`,
		`{"model":"m1","priority":0}`:                 `{"model":"m1","priority":2}`,
		" {\n \"model\" : \"m1\", \"priority\": -5 }": " {\n \"model\" : \"m1\", \"priority\": 2 }",
	} {
		if got := send(body); got != want {
			t.Errorf("%q reached the engine as %q, want %q", body, got, want)
		}
	}
}

func TestSetPriority(t *testing.T) {
	for body, want := range map[string]string{
		`{}`:                                `{"priority":1}`,
		` { } `:                             ` {"priority":1 } `,
		`{"a":1}`:                           `{"priority":1,"a":1}`,
		`{"priority":9,"x":{"priority":3}}`: `{"priority":1,"x":{"priority":3}}`,
		`[1,2]`:                             `[1,2]`,
		`not json`:                          `not json`,
		`{"a":1} trailing`:                  `{"a":1} trailing`,
	} {
		if got := string(setPriority([]byte(body), 1)); got != want {
			t.Errorf("setPriority(%q) = %q, want %q", body, got, want)
		}
	}
}

// fakeQuotas is Options.Quotas for tests: a fixed use per key.
type fakeQuotas struct {
	mu   sync.Mutex
	use  map[string]Use
	end  time.Time
	asks []string
}

func (q *fakeQuotas) Today(client string, _ time.Time) (Use, time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.asks = append(q.asks, client)
	return q.use[client], q.end
}

func (q *fakeQuotas) set(client string, u Use) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.use[client] = u
}

// Quotas at their edges: a key is refused 429 quota_exceeded, with
// Retry-After at the window's end, once its use today has reached a
// quota, not before; keys without one (and admins) are never asked.
func TestGateway_QuotaExceeded(t *testing.T) {
	keys := mustKeys(t, "tok:sk-tok tokens_per_day=100\ngpu:sk-gpu gpu_hours_per_day=1.5\nfree:sk-free\nops:sk-ops role=admin\n")
	now := time.Date(2026, 3, 2, 22, 59, 30, 0, time.UTC)
	q := &fakeQuotas{use: map[string]Use{}, end: time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)}
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{APIKeys: keys, Quotas: q, Now: func() time.Time { return now }})
	post := func(key string) (*http.Response, []byte) {
		return e.do("POST", "/v1/chat/completions", `{"model":"m1"}`, map[string]string{"Authorization": "Bearer " + key})
	}
	for _, c := range []struct {
		key  string
		use  Use
		want int
	}{
		{"sk-tok", Use{Tokens: 99}, 200},
		{"sk-tok", Use{Tokens: 100}, 429},
		{"sk-tok", Use{Tokens: 100, GPUHours: 1e9}, 429},
		{"sk-gpu", Use{GPUHours: 1.4999, Tokens: 1e12}, 200},
		{"sk-gpu", Use{GPUHours: 1.5}, 429},
		{"sk-free", Use{Tokens: 1e12, GPUHours: 1e9}, 200},
		{"sk-ops", Use{Tokens: 1e12, GPUHours: 1e9}, 200},
	} {
		name := strings.TrimPrefix(c.key, "sk-")
		q.set(name, c.use)
		resp, b := post(c.key)
		if resp.StatusCode != c.want {
			t.Errorf("%s using %+v: %d %s, want %d", name, c.use, resp.StatusCode, b, c.want)
			continue
		}
		if c.want == 200 {
			e.models.outcome()
			continue
		}
		var body errorBody
		if err := json.Unmarshal(b, &body); err != nil || body.Error.Code != "quota_exceeded" {
			t.Errorf("%s: body %s", name, b)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "3630" { // 1h 0m 30s to midnight
			t.Errorf("%s: Retry-After %q, want 3630", name, ra)
		}
		if !strings.Contains(body.Error.Message, "renews at 2026-03-03 00:00") {
			t.Errorf("%s: message %q", name, body.Error.Message)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, who := range q.asks {
		if who == "free" || who == "ops" {
			t.Errorf("the quotas were asked about %s, which has none", who)
		}
	}
}
