package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/internal/httpfixture"
	"github.com/napd/napd/tests/harness"
)

const recorded = "../../testdata/llamacpp/router/"

// routerClient is a client of llama.cpp's router API as the UIs write
// one: GET /models for the load state, POST /models/load and /unload,
// GET /models/sse for the changes.
type routerClient struct {
	t *testing.T
	n *harness.Napd
}

func (c routerClient) post(path, body string) (int, any) {
	c.t.Helper()
	resp, b, err := c.n.Post(ctxFor(c.t, 10*time.Second), path, body)
	if err != nil {
		c.t.Fatalf("POST %s: %v", path, err)
	}
	return resp.StatusCode, httpfixture.JSON(c.t, b)
}

// status is GET /models' status.value of model, and its entry.
func (c routerClient) status(model string) (string, map[string]any) {
	c.t.Helper()
	resp, err := http.Get(c.n.URL("/models"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		c.t.Fatal(err)
	}
	for _, e := range list.Data {
		if e["id"] == model {
			return e["status"].(map[string]any)["value"].(string), e
		}
	}
	c.t.Fatalf("GET /models lists no %s", model)
	return "", nil
}

// statuses follows GET /models/sse and keeps the statuses of model's
// events, in order.
func (c routerClient) statuses(model string) func() []string {
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", c.n.URL("/models/sse"), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		c.t.Fatalf("GET /models/sse: %v %v", resp, err)
	}
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if st := eventStatus(sc.Text(), model); st != "" {
				mu.Lock()
				got = append(got, st)
				mu.Unlock()
			}
		}
	}()
	c.t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// eventStatus is "EVENT STATUS" of an SSE line about model, "" for others.
func eventStatus(line, model string) string {
	data, ok := strings.CutPrefix(line, "data: ")
	if !ok {
		return ""
	}
	var ev struct {
		Model string `json:"model"`
		Event string `json:"event"`
		Data  struct {
			Status string `json:"status"`
		} `json:"data"`
	}
	if json.Unmarshal([]byte(data), &ev) != nil || ev.Model != model {
		return ""
	}
	return ev.Event + " " + ev.Data.Status
}

// path is a status sequence with repeats collapsed (progress events).
func path(events []string) []string {
	var out []string
	for _, e := range events {
		st := e[strings.Index(e, " ")+1:]
		if len(out) == 0 || out[len(out)-1] != st {
			out = append(out, st)
		}
	}
	return out
}

func recordedJSON(t *testing.T, file string) (int, any) {
	r := httpfixture.Load(t, recorded+file)
	return r.Status, httpfixture.JSON(t, r.Body)
}

// The recorded router exchange (testdata/llamacpp/router, a real
// llama-server --models-dir), replayed against napd by a client written
// against it: the same calls in the same order, the same answers and the
// same observable states: unloaded; unload refused (not running); an
// unknown model 404; load; loading; loaded; load again refused (already
// running); a chat; unload; unloaded; a chat loads it again; and the same
// path of states on /models/sse.
func TestRouter_RecordedExchange(t *testing.T) {
	model, _ := demo(t, "tiny", `sleep = "stop"`, "--flavor", "llamacpp", "--startup-delay", "1500ms", "--ttft", "0")
	n := harness.Start(t, harness.Options{Models: model})
	c := routerClient{t, n}
	events := c.statuses("tiny")

	st, entry := c.status("tiny")
	_, rec := recordedJSON(t, "models-unloaded.http")
	recEntry := rec.(map[string]any)["data"].([]any)[0].(map[string]any)
	if st != "unloaded" {
		t.Fatalf("at start: %s, want unloaded", st)
	}
	for _, k := range []string{"id", "aliases", "tags", "object", "owned_by", "created"} {
		if reflect.TypeOf(entry[k]) != reflect.TypeOf(recEntry[k]) {
			t.Errorf("entry %s: %T, llama.cpp %T", k, entry[k], recEntry[k])
		}
	}

	same := func(what string, code int, body any, file string) {
		t.Helper()
		wantCode, want := recordedJSON(t, file)
		if code != wantCode || !reflect.DeepEqual(body, want) {
			t.Errorf("%s = %d %v; llama.cpp answered %d %v", what, code, body, wantCode, want)
		}
	}
	code, body := c.post("/models/unload", `{"model":"tiny"}`)
	same("unload while unloaded", code, body, "unload-not-running.http")
	code, body = c.post("/models/load", `{"model":"nosuch"}`)
	_, unknown := recordedJSON(t, "load-unknown.http")
	if got, want := body.(map[string]any)["error"].(map[string]any), unknown.(map[string]any)["error"].(map[string]any); code != 404 || got["type"] != want["type"] || got["code"] != want["code"] {
		t.Errorf("load of an unknown model = %d %v; llama.cpp answered 404 %v", code, body, want)
	}
	code, body = c.post("/models/load", `{"model":"tiny"}`)
	same("load", code, body, "load.http")
	if st, _ := c.status("tiny"); st != "loading" {
		t.Errorf("just after the load: %s, want loading", st)
	}
	eventually(t, 20*time.Second, "loaded", func() bool { st, _ := c.status("tiny"); return st == "loaded" })
	code, body = c.post("/models/load", `{"model":"tiny"}`)
	same("load again", code, body, "load-already.http")

	chat := func() {
		t.Helper()
		resp, b, err := n.Post(ctxFor(t, 20*time.Second), "/v1/chat/completions", chatWith("tiny", "hi", false, 3))
		if err != nil {
			t.Fatal(err)
		}
		wantCompletion(t, resp, b)
	}
	chat()
	code, body = c.post("/models/unload", `{"model":"tiny"}`)
	same("unload", code, body, "unload.http")
	eventually(t, 20*time.Second, "unloaded", func() bool { st, _ := c.status("tiny"); return st == "unloaded" })
	chat() // a request loads it, as in the recording
	if st, _ := c.status("tiny"); st != "loaded" {
		t.Errorf("after the chat: %s, want loaded", st)
	}

	// The recorded stream's path of states: napd's is the same after the
	// status it sends first (llama.cpp sends nothing when a stream opens).
	data, err := os.ReadFile(recorded + "models-sse.txt")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(string(data), "\n") {
		if st := eventStatus(l, "tiny"); st != "" {
			want = append(want, st)
		}
	}
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for got = events(); len(path(got)) < len(path(want))+1 && time.Now().Before(deadline); got = events() {
		time.Sleep(20 * time.Millisecond)
	}
	if len(got) == 0 || got[0] != "model_status unloaded" || !reflect.DeepEqual(path(got)[1:], path(want)) {
		t.Errorf("/models/sse events %q (states %q); want model_status unloaded, then the recorded %q", got, path(got), path(want))
	}
	for i, e := range got {
		if strings.HasSuffix(e, " loading") && strings.HasSuffix(got[i-1], "unloaded") && e != "model_status loading" {
			t.Errorf("a load began with %q; llama.cpp begins one with model_status loading", e)
		}
	}
}

// napd stopping ends the router API's event streams cleanly (the end of
// the stream, not a cut connection) and does not wait its grace period
// for them.
func TestRouter_EventsEndOnShutdown(t *testing.T) {
	model, _ := demo(t, "tiny", "", "--flavor", "llamacpp")
	n := harness.Start(t, harness.Options{Models: model})
	resp, err := http.Get(n.URL("/models/sse"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() || eventStatus(sc.Text(), "tiny") != "model_status unloaded" {
		t.Fatalf("first event %q", sc.Text())
	}
	start := time.Now()
	n.Signal(syscall.SIGTERM)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, ":") {
			t.Errorf("after SIGTERM: %q", l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Errorf("the stream was cut (%v), not ended", err)
	}
	if err := n.Wait(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("napd took %s to stop with a stream open", took)
	}
}
