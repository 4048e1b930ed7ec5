package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/internal/httpfixture"
)

const routerRecordings = "../testdata/llamacpp/router/"

// routerModels is a Models and Router whose listing the test sets; it
// records loads and unloads and signals Changes when told.
type routerModels struct {
	mu        sync.Mutex
	infos     []ModelInfo
	loads     []string
	unloads   []string
	unloadErr error
	changed   chan struct{}
	stops     int
}

func newRouterModels(infos ...ModelInfo) *routerModels {
	return &routerModels{infos: infos, changed: make(chan struct{}, 1)}
}

func (f *routerModels) Resolve(name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.infos {
		if m.Name == name || slices.Contains(m.Aliases, name) {
			return m.Name, true
		}
	}
	return "", false
}

func (f *routerModels) List() []ModelInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.infos)
}

func (f *routerModels) Admit(context.Context, lease.Request) (*Ticket, error) {
	return nil, errors.New("no engine in this test")
}

func (f *routerModels) QueueDepth(string) int { return 0 }

func (f *routerModels) Load(model, client string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads = append(f.loads, model+" by "+client)
	return nil
}

func (f *routerModels) Unload(model string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unloads = append(f.unloads, model)
	return f.unloadErr
}

func (f *routerModels) Changes() (<-chan struct{}, func()) {
	return f.changed, func() { f.mu.Lock(); f.stops++; f.mu.Unlock() }
}

// set changes model's listing and signals a change.
func (f *routerModels) set(model string, change func(*ModelInfo)) {
	f.mu.Lock()
	for i := range f.infos {
		if f.infos[i].Name == model {
			change(&f.infos[i])
		}
	}
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

func (f *routerModels) recorded() (loads, unloads []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.loads), slices.Clone(f.unloads)
}

type routerEnv struct {
	t      *testing.T
	models *routerModels
	gw     *Gateway
	url    string
	client *http.Client
}

func newRouterEnv(t *testing.T, opts Options, models *routerModels) *routerEnv {
	t.Helper()
	e := &routerEnv{t: t, models: models, gw: New(opts, models), client: &http.Client{Transport: &http.Transport{}}}
	e.url = serveGateway(t, e.gw.Handler(), nil).URL
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

func (e *routerEnv) do(method, path, body string, header ...string) (*http.Response, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// asRemote serves one request as from a client that is not on loopback.
func (e *routerEnv) asRemote(method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = "10.0.0.7:41000"
	rec := httptest.NewRecorder()
	e.gw.Handler().ServeHTTP(rec, req)
	return rec
}

var states = newRouterModels(
	ModelInfo{Name: "up", Aliases: []string{"u"}, State: "awake", Load: LoadLoaded, Args: []string{"/usr/bin/llama-server", "-m", "/srv/models/up.gguf"}},
	ModelInfo{Name: "waking", State: "waking", Load: LoadLoading},
	ModelInfo{Name: "parked", State: "sleeping", Load: LoadSleeping},
	ModelInfo{Name: "down", State: "sleeping", Load: LoadUnloaded},
	ModelInfo{Name: "broken", State: "failed", Reason: "failed: exit status 1 (3 of 3 attempts)", Load: LoadUnloaded, Failed: true},
)

// GET /models in llama.cpp's shape: the fields its clients read, as a
// real llama-server's router answered (recorded), with the status value
// of each state, failures with their reason, and the engine's command
// line for admins only (loopback without keys here).
func TestRouter_ModelsList(t *testing.T) {
	e := newRouterEnv(t, Options{}, newRouterModels(states.List()...))
	resp, b := e.do("GET", "/models", "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /models = %d %s", resp.StatusCode, b)
	}
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	json.Unmarshal(b, &list)
	recorded := httpfixture.JSON(t, httpfixture.Load(t, routerRecordings+"models-loaded.http").Body).(map[string]any)["data"].([]any)[0].(map[string]any)
	if list.Object != "list" || len(list.Data) != 5 {
		t.Fatalf("list %s", b)
	}
	for _, entry := range list.Data {
		for _, k := range []string{"id", "aliases", "tags", "object", "owned_by", "created", "status"} {
			if reflect.TypeOf(entry[k]) != reflect.TypeOf(recorded[k]) {
				t.Errorf("%v: %s is %T, llama.cpp sends %T", entry["id"], k, entry[k], recorded[k])
			}
		}
	}
	status := func(i int) map[string]any { return list.Data[i]["status"].(map[string]any) }
	for i, want := range []string{"loaded", "loading", "sleeping", "unloaded", "unloaded"} {
		if status(i)["value"] != want {
			t.Errorf("%v: status %v, want %s", list.Data[i]["id"], status(i), want)
		}
	}
	if s := status(4); s["failed"] != true || s["exit_code"] != 1.0 || !strings.Contains(s["reason"].(string), "exit status 1") {
		t.Errorf("failed model's status %v", s)
	}
	if _, ok := status(3)["failed"]; ok {
		t.Errorf("a model that did not fail: %v", status(3))
	}
	if args := status(0)["args"]; !reflect.DeepEqual(args, []any{"/usr/bin/llama-server", "-m", "/srv/models/up.gguf"}) {
		t.Errorf("args for a loopback client without keys: %v", args)
	}
	if aliases := list.Data[0]["aliases"]; !reflect.DeepEqual(aliases, []any{"u"}) {
		t.Errorf("aliases %v", aliases)
	}
	// /v1/models carries the same status beside napd's own fields.
	_, b = e.do("GET", "/v1/models", "")
	v1 := httpfixture.JSON(t, b).(map[string]any)["data"].([]any)
	if s := v1[4].(map[string]any)["status"].(map[string]any); s["value"] != "unloaded" || s["failed"] != true {
		t.Errorf("/v1/models status %v", s)
	}
	if napd := v1[0].(map[string]any)["napd"].(map[string]any); napd["state"] != "awake" {
		t.Errorf("/v1/models napd %v", napd)
	}
	// Not an admin: no command lines.
	rec := e.asRemote("GET", "/models", "")
	if rec.Code != 200 || strings.Contains(rec.Body.String(), "llama-server") {
		t.Errorf("GET /models from a remote client = %d %s; want no args", rec.Code, rec.Body)
	}
}

// Aliases listed as entries of their own (list_aliases) have the same
// status as their model.
func TestRouter_ModelsListAliases(t *testing.T) {
	e := newRouterEnv(t, Options{ListAliases: true}, newRouterModels(states.List()[0]))
	_, b := e.do("GET", "/models", "")
	data := httpfixture.JSON(t, b).(map[string]any)["data"].([]any)
	if len(data) != 2 || data[1].(map[string]any)["id"] != "u" || data[1].(map[string]any)["status"].(map[string]any)["value"] != "loaded" {
		t.Errorf("entries %s", b)
	}
}

// Load and unload answer as a real llama-server's router (recorded):
// {"success":true}, and its errors in its shape: 404 for an unknown model,
// 400 "model is already running" (loaded or loading), 400 "model is not
// running" (unloaded, or asleep).
func TestRouter_LoadAndUnload(t *testing.T) {
	m := newRouterModels(states.List()...)
	e := newRouterEnv(t, Options{}, m)
	same := func(what string, b []byte, file string) {
		t.Helper()
		if rec := httpfixture.Load(t, routerRecordings+file); !reflect.DeepEqual(httpfixture.JSON(t, b), httpfixture.JSON(t, rec.Body)) {
			t.Errorf("%s = %s, llama.cpp answered %s", what, b, rec.Body)
		}
	}
	resp, b := e.do("POST", "/models/load", `{"model":"down"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("load = %d %s", resp.StatusCode, b)
	}
	same("load", b, "load.http")
	resp, b = e.do("POST", "/models/load", `{"model":"u"}`) // an alias of a loaded model
	if resp.StatusCode != 400 {
		t.Errorf("load of a loaded model = %d", resp.StatusCode)
	}
	same("load of a loaded model", b, "load-already.http")
	if resp, _ := e.do("POST", "/models/load", `{"model":"waking"}`); resp.StatusCode != 400 {
		t.Errorf("load of a loading model = %d", resp.StatusCode)
	}
	for _, name := range []string{"parked", "broken"} { // asleep: woken; failed: tried again
		if resp, b := e.do("POST", "/models/load", `{"model":"`+name+`"}`); resp.StatusCode != 200 {
			t.Errorf("load of %s = %d %s", name, resp.StatusCode, b)
		}
	}
	resp, b = e.do("POST", "/models/load", `{"model":"nosuch"}`)
	unknown := httpfixture.JSON(t, httpfixture.Load(t, routerRecordings+"load-unknown.http").Body).(map[string]any)["error"].(map[string]any)
	got := httpfixture.JSON(t, b).(map[string]any)["error"].(map[string]any)
	if resp.StatusCode != 404 || got["type"] != unknown["type"] || got["code"] != unknown["code"] {
		t.Errorf("load of an unknown model = %d %s; llama.cpp answers %v", resp.StatusCode, b, unknown)
	}

	resp, b = e.do("POST", "/models/unload", `{"model":"up"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("unload = %d %s", resp.StatusCode, b)
	}
	same("unload", b, "unload.http")
	for _, name := range []string{"down", "parked", "broken"} {
		resp, b := e.do("POST", "/models/unload", `{"model":"`+name+`"}`)
		if resp.StatusCode != 400 {
			t.Errorf("unload of %s = %d", name, resp.StatusCode)
		}
		same("unload of "+name, b, "unload-not-running.http")
	}
	m.unloadErr = errors.New("sleep waking: cannot sleep while waking")
	resp, b = e.do("POST", "/models/unload", `{"model":"waking"}`)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "cannot sleep while waking") {
		t.Errorf("a declined unload = %d %s", resp.StatusCode, b)
	}
	loads, unloads := m.recorded()
	if !slices.Equal(loads, []string{"down by ", "parked by ", "broken by "}) || !slices.Equal(unloads, []string{"up", "waking"}) {
		t.Errorf("loads %q, unloads %q", loads, unloads)
	}

	for _, tc := range []struct{ body, msg string }{
		{`not json`, "not a valid JSON object"},
		{`{}`, `has no \"model\"`},
	} {
		resp, b := e.do("POST", "/models/load", tc.body)
		if resp.StatusCode != 400 || !strings.Contains(string(b), tc.msg) {
			t.Errorf("load %s = %d %s", tc.body, resp.StatusCode, b)
		}
	}
	if resp, _ := e.do("GET", "/models/load", ""); resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /models/load = %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if resp, _ := e.do("POST", "/models", ""); resp.StatusCode != 405 {
		t.Errorf("POST /models = %d", resp.StatusCode)
	}
	if resp, _ := e.do("GET", "/models/other", ""); resp.StatusCode != 404 {
		t.Errorf("GET /models/other = %d", resp.StatusCode)
	}
}

// Who may: anyone listing (a key sees the models it may use); load and
// unload for admin keys, control=true keys, or without keys loopback
// clients; the rest 403 in OpenAI's shape. A control key loads only the
// models its patterns allow.
func TestRouter_WhoMay(t *testing.T) {
	keys, err := parseAPIKeys("keys", []byte("user:sk-user models=up\nops:sk-ops role=admin\nui:sk-ui control=true models=down\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := newRouterModels(states.List()...)
	e := newRouterEnv(t, Options{APIKeys: keys}, m)
	bearer := func(k string) []string { return []string{"Authorization", "Bearer " + k} }

	resp, b := e.do("GET", "/models", "", bearer("sk-user")...)
	if resp.StatusCode != 200 || strings.Count(string(b), `"id"`) != 1 || strings.Contains(string(b), "llama-server") {
		t.Errorf("an inference key lists %d %s; want its one model, no args", resp.StatusCode, b)
	}
	if resp, b := e.do("GET", "/models", "", bearer("sk-ops")...); resp.StatusCode != 200 || !strings.Contains(string(b), "llama-server") {
		t.Errorf("an admin key lists %d %s; want the args", resp.StatusCode, b)
	}
	resp, b = e.do("GET", "/models", "")
	wantError(t, resp, b, 401, "invalid_api_key")

	resp, b = e.do("POST", "/models/unload", `{"model":"up"}`, bearer("sk-user")...)
	wantError(t, resp, b, 403, "control_not_allowed")
	if resp, b := e.do("POST", "/models/unload", `{"model":"up"}`, bearer("sk-ops")...); resp.StatusCode != 200 {
		t.Errorf("an admin key unloads: %d %s", resp.StatusCode, b)
	}
	if resp, b := e.do("POST", "/models/load", `{"model":"down"}`, bearer("sk-ui")...); resp.StatusCode != 200 {
		t.Errorf("a control key loads: %d %s", resp.StatusCode, b)
	}
	resp, b = e.do("POST", "/models/load", `{"model":"parked"}`, bearer("sk-ui")...)
	wantError(t, resp, b, 403, "model_not_allowed")
	resp, b = e.do("POST", "/models/load", `{"model":"nosuch"}`, bearer("sk-ui")...)
	wantError(t, resp, b, 403, "model_not_allowed") // a key cannot probe for other models

	open := newRouterEnv(t, Options{}, newRouterModels(states.List()...))
	rec := open.asRemote("POST", "/models/load", `{"model":"down"}`)
	resp = rec.Result()
	wantError(t, resp, rec.Body.Bytes(), 403, "control_loopback_only")
	if rec := open.asRemote("GET", "/models", ""); rec.Code != 200 {
		t.Errorf("a remote client lists: %d", rec.Code)
	}
	loads, unloads := m.recorded()
	if !slices.Equal(loads, []string{"down by ui"}) || !slices.Equal(unloads, []string{"up"}) {
		t.Errorf("loads %q, unloads %q", loads, unloads)
	}
}

// The same paths toward an engine stay engine controls: refused through
// /upstream/ and on a model's own socket.
func TestRouter_EnginePathsStayRefused(t *testing.T) {
	eng := &okEngine{}
	e := newEnv(t, eng.ServeHTTP, Options{})
	for _, p := range []string{"/upstream/m1/models/load", "/upstream/m1/models/unload", "/upstream/m1/models"} {
		resp, b := e.do("POST", p, `{"model":"x"}`, nil)
		wantError(t, resp, b, 403, "engine_control_refused")
	}
	dedicated := serveGateway(t, e.gw.ModelHandler("m1"), nil)
	resp, err := http.Post(dedicated.URL+"/models/load", "application/json", strings.NewReader(`{"model":"m1"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, resp, b, 403, "engine_control_refused")
	if len(eng.seen()) != 0 {
		t.Errorf("the engine saw %v", eng.seen())
	}
}

// sse reads an event stream's data payloads and comments as they come.
type sse struct {
	t      *testing.T
	resp   *http.Response
	lines  chan string
	cancel context.CancelFunc
}

func (e *routerEnv) events(header ...string) *sse {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/models/sse", nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	s := &sse{t: e.t, resp: resp, lines: make(chan string, 100), cancel: cancel}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if l := sc.Text(); l != "" {
				s.lines <- l
			}
		}
	}()
	e.t.Cleanup(func() { cancel(); resp.Body.Close() })
	return s
}

// next is the next line (an event's data, or a comment).
func (s *sse) next() string {
	s.t.Helper()
	select {
	case l, ok := <-s.lines:
		if !ok {
			s.t.Fatal("the stream ended")
		}
		return l
	case <-time.After(5 * time.Second):
		s.t.Fatal("no event within 5 s")
	}
	return ""
}

// event is the next event, as "model event status [detail]".
func (s *sse) event() string {
	s.t.Helper()
	for {
		l := s.next()
		if strings.HasPrefix(l, ":") {
			continue
		}
		var ev struct {
			Model string `json:"model"`
			Event string `json:"event"`
			Data  *struct {
				Status   string `json:"status"`
				Progress *struct {
					Value float64 `json:"value"`
				} `json:"progress"`
				Info *struct {
					ID string `json:"id"`
				} `json:"info"`
				ExitCode *int   `json:"exit_code"`
				Failed   bool   `json:"failed"`
				Reason   string `json:"reason"`
			} `json:"data"`
		}
		data, ok := strings.CutPrefix(l, "data: ")
		if !ok || json.Unmarshal([]byte(data), &ev) != nil {
			s.t.Fatalf("not an event: %q", l)
		}
		out := ev.Model + " " + ev.Event
		if d := ev.Data; d != nil {
			out += " " + d.Status
			switch {
			case d.Progress != nil:
				out += fmt.Sprintf(" %.1f", d.Progress.Value)
			case d.Info != nil:
				out += " info=" + d.Info.ID
			case d.Failed:
				out += fmt.Sprintf(" exit=%d failed (%s)", *d.ExitCode, d.Reason)
			case d.ExitCode != nil:
				out += fmt.Sprintf(" exit=%d", *d.ExitCode)
			}
		}
		return out
	}
}

func (s *sse) want(events ...string) {
	s.t.Helper()
	for _, w := range events {
		if got := s.event(); got != w {
			s.t.Fatalf("event %q, want %q", got, w)
		}
	}
}

// GET /models/sse: every model's status first, then llama.cpp's events at
// each change (model_status when a load starts, status_change with the
// progress napd knows, the info once loaded, the exit code once unloaded,
// a failure's reason), model_remove for a model a reload removed, and a
// keep-alive comment while nothing happens.
func TestRouter_Events(t *testing.T) {
	m := newRouterModels(
		ModelInfo{Name: "tiny", Aliases: []string{"t"}, State: "sleeping", Load: LoadUnloaded},
		ModelInfo{Name: "other", State: "awake", Load: LoadLoaded},
	)
	e := newRouterEnv(t, Options{StreamKeepAlive: 100 * time.Millisecond}, m)
	s := e.events()
	if ct := s.resp.Header.Get("Content-Type"); s.resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("GET /models/sse = %d %q", s.resp.StatusCode, ct)
	}
	s.want("tiny model_status unloaded", "other model_status loaded")

	m.set("tiny", func(i *ModelInfo) { i.Load, i.State = LoadLoading, "waking" })
	s.want("tiny model_status loading", "tiny status_change loading")
	half := 0.5
	m.set("tiny", func(i *ModelInfo) { i.Progress = &half })
	s.want("tiny status_change loading 0.5")
	m.set("tiny", func(i *ModelInfo) { i.Load, i.Progress = LoadLoaded, nil })
	s.want("tiny status_change loaded info=tiny")
	m.set("tiny", func(i *ModelInfo) { i.Load = LoadUnloaded })
	s.want("tiny status_change unloaded exit=0")
	m.set("other", func(i *ModelInfo) { i.Load, i.Failed, i.Reason = LoadUnloaded, true, "failed: health check failed" })
	s.want("other status_change unloaded exit=1 failed (failed: health check failed)")
	m.set("other", func(i *ModelInfo) { i.Reason = "failed: health check failed" }) // no change: no event
	m.mu.Lock()
	m.infos = m.infos[:1]
	m.mu.Unlock()
	m.set("tiny", func(*ModelInfo) {})
	s.want("other model_remove")
	for l := s.next(); l != ": keep-alive"; l = s.next() {
		t.Fatalf("got %q, want a keep-alive comment", l)
	}
}

// A progress figure the model layer has without a state change shows
// while the model loads: the stream looks again every second.
func TestRouter_EventsPollWhileLoading(t *testing.T) {
	m := newRouterModels(ModelInfo{Name: "tiny", Load: LoadLoading})
	e := newRouterEnv(t, Options{}, m)
	s := e.events()
	s.want("tiny model_status loading")
	third := 0.3
	m.mu.Lock()
	m.infos[0].Progress = &third // no Changes signal
	m.mu.Unlock()
	s.want("tiny status_change loading 0.3")
}

// Event streams are bounded per client (and in all); napd stopping ends
// them cleanly: the stream's end, not a cut connection.
func TestRouter_EventsBoundedAndEndedOnStop(t *testing.T) {
	stopping := make(chan struct{})
	keys, _ := parseAPIKeys("keys", []byte("a:sk-a\nb:sk-b\n"))
	m := newRouterModels(ModelInfo{Name: "tiny", Load: LoadLoaded})
	e := newRouterEnv(t, Options{APIKeys: keys, Streams: NewStreamLimit(3, 2), Stopping: stopping}, m)
	a := []string{"Authorization", "Bearer sk-a"}
	b := []string{"Authorization", "Bearer sk-b"}
	var open []*sse
	for _, h := range [][]string{a, a, b} {
		s := e.events(h...)
		s.want("tiny model_status loaded")
		open = append(open, s)
	}
	resp, body := e.do("GET", "/models/sse", "", a...)
	wantError(t, resp, body, 429, "too_many_streams")
	resp, body = e.do("GET", "/models/sse", "", b...) // b's own bound is not reached, but all three are open
	wantError(t, resp, body, 429, "too_many_streams")

	close(stopping)
	for _, s := range open {
		for l := range s.lines {
			t.Errorf("after stopping: %q", l)
		}
	}
	// Their room is free again once they ended.
	deadline := time.Now().Add(5 * time.Second)
	for e.gw.streams.open("a") > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // the handlers' ends send nothing
	}
	if n := e.gw.streams.open("a"); n != 0 {
		t.Errorf("%d streams of a still counted after napd stopped", n)
	}
	m.mu.Lock()
	stops := m.stops
	m.mu.Unlock()
	if stops != 3 {
		t.Errorf("%d subscriptions ended, want 3", stops)
	}
}

func TestStreamLimit(t *testing.T) {
	l := NewStreamLimit(0, 0)
	if l.total != DefaultMaxStreams || l.perClient != DefaultStreamsPerClient {
		t.Fatalf("defaults %d, %d", l.total, l.perClient)
	}
	l = NewStreamLimit(3, 2)
	got := []bool{l.acquire("x"), l.acquire("x"), l.acquire("x"), l.acquire("y"), l.acquire("z")}
	if !slices.Equal(got, []bool{true, true, false, true, false}) {
		t.Errorf("acquired %v", got)
	}
	l.release("x")
	if !l.acquire("z") || l.open("x") != 1 || !maps.Equal(l.per, map[string]int{"x": 1, "y": 1, "z": 1}) {
		t.Errorf("after a release: %v", l.per)
	}
}

// A load napd measures shows in /v1/models' napd object (bytes read, of
// the weights, the fraction and the time left), and its fraction as the
// router API's status.progress.value.
func TestRouter_LoadProgressInModels(t *testing.T) {
	st := &loadprogress.Status{Read: 1 << 30, Weights: 4 << 30, Fraction: 0.25, HaveFraction: true, Left: 30 * time.Second, HaveLeft: true}
	m := newRouterModels(ModelInfo{Name: "big", State: "waking", Load: LoadLoading, Loading: st, Progress: &st.Fraction})
	e := newRouterEnv(t, Options{}, m)
	_, b := e.do("GET", "/v1/models", "")
	var list struct {
		Data []struct {
			Napd struct {
				Load *loadprogress.Wire `json:"load"`
			} `json:"napd"`
			Status struct {
				Progress *struct {
					Value float64 `json:"value"`
				} `json:"progress"`
			} `json:"status"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil || len(list.Data) != 1 {
		t.Fatalf("/v1/models %s: %v", b, err)
	}
	d := list.Data[0]
	if l := d.Napd.Load; l == nil || l.ReadBytes != 1<<30 || l.WeightBytes != 4<<30 || l.Progress == nil || *l.Progress != 0.25 ||
		l.LeftMs == nil || *l.LeftMs != 30_000 {
		t.Errorf("napd.load %s", b)
	}
	if d.Status.Progress == nil || d.Status.Progress.Value != 0.25 {
		t.Errorf("status.progress %s", b)
	}
}
