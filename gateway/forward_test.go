package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// The engine's request and answer lose their hop-by-hop headers (those
// Connection names too), keep TE: trailers, carry napd's forwarding
// headers and no default User-Agent; trailers come through.
func TestForward_Headers(t *testing.T) {
	seen := make(chan http.Header, 1)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h := r.Header.Clone()
		h.Set("Host", r.Host)
		seen <- h
		w.Header().Set("Connection", "X-Engine-Hop")
		w.Header().Set("X-Engine-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("Content-Type", "application/json")
		w.Header()["X-Multi"] = []string{"a", "b"}
		_, _ = io.WriteString(w, `{"ok":true}`)
		w.Header().Set("X-Sum", "42")
	}, Options{})
	base := e.srv.URL
	req, err := http.NewRequest("POST", base+"/v1/completions?a=1;b=2", strings.NewReader(`{"model":"m1"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header["User-Agent"] = []string{""} // none
	req.Header.Set("Connection", "X-Hop, keep-alive")
	req.Header.Set("X-Hop", "1")
	req.Header.Set("Te", "trailers")
	req.Header.Set("Expect", "100-continue")
	req.Header.Set("Cookie", "session=1")
	req.Header.Set("Proxy-Authorization", "Basic eA==")
	req.Header.Set("X-Forwarded-For", "10.9.9.9")
	req.Header.Set("Forwarded", "for=10.9.9.9")
	req.Header.Set("X-Kept", "yes")
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != `{"ok":true}` {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	h := <-seen
	for _, k := range []string{"X-Hop", "Cookie", "Proxy-Authorization", "Forwarded", "User-Agent", "Keep-Alive", "Expect"} {
		if v, ok := h[k]; ok {
			t.Errorf("engine got %s: %q", k, v)
		}
	}
	want := map[string]string{
		"Te": "trailers", "X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": strings.TrimPrefix(base, "http://"),
		"X-Forwarded-Proto": "http", "X-Kept": "yes", "Host": e.models.target.Host,
	}
	for k, want := range want {
		if got := h.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("engine got %s: %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"X-Engine-Hop", "Keep-Alive"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("client got %s: %q", k, v)
		}
	}
	if got := resp.Header.Values("X-Multi"); len(got) != 2 || got[0] != "a" || got[1] != "b" ||
		resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("client got header %v", resp.Header)
	}
	if got := resp.Trailer.Get("X-Sum"); got != "42" {
		t.Errorf("trailer X-Sum %q, want 42 (trailers %v)", got, resp.Trailer)
	}
	e.models.outcome()
}

// The engine's answer's fields go on edited as any answer is: hop-by-hop
// fields and those Connection names dropped, an engine's 503 sent as 502
// with X-Napd-Engine-Status, X-Queue-Depth added, the rest as it came.
func TestForward_AnswerEdited(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h := w.Header()
		h.Set("Connection", "X-Drop")
		h.Set("X-Drop", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Content-Type", "application/json")
		h["X-Multi"] = []string{"a", "b"}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":"busy"}`)
	}, Options{})
	nc, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	body := `{"model":"m1"}`
	fmt.Fprintf(nc, "POST /v1/completions HTTP/1.1\r\nHost: napd\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(nc)
	var names []string
	status, err := br.ReadString('\n')
	for err == nil {
		var line string
		if line, err = br.ReadString('\n'); line == "\r\n" {
			break
		}
		names = append(names, strings.TrimSpace(line))
	}
	if err != nil {
		t.Fatal(err)
	}
	rest, _ := br.Peek(len(`{"error":"busy"}`))
	if !strings.HasPrefix(status, "HTTP/1.1 502 ") || string(rest) != `{"error":"busy"}` {
		t.Fatalf("%q %q", status, rest)
	}
	// net/http's server writes the fields sorted by name.
	want := []string{"Content-Length: 16", "Content-Type: application/json", "Date: ", "X-Multi: a", "X-Multi: b",
		HeaderEngineStatus + ": 503", HeaderQueueDepth + ": 3"}
	if len(names) != len(want) {
		t.Fatalf("fields %q, want %q", names, want)
	}
	for i := range want {
		if !strings.HasPrefix(names[i], want[i]) {
			t.Errorf("fields %q, want %q", names, want)
			break
		}
	}
	e.models.outcome()
}

// An engine's 1xx answer reaches the client before the final one, for a
// body read whole and for a streamed upload.
func TestForward_Interim(t *testing.T) {
	form, formType := formBody(t, []string{"model", "@file"}, map[string]string{"model": "m1"}, []byte("RIFF"))
	for _, c := range []struct {
		name, path, contentType, body string
	}{
		{"json", "/v1/completions", "application/json", `{"model":"m1"}`},
		{"streamed upload", "/v1/audio/transcriptions", formType, string(form)},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Link", "</style.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				w.Header().Del("Link")
				w.Header().Set("Content-Type", "application/json")
				w.Header()["X-Multi"] = []string{"a", "b"}
				_, _ = io.WriteString(w, `{"ok":true}`)
			}, Options{})
			var hints []string
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				hints = append(hints, h.Get("Link"))
				return nil
			}}
			req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
				"POST", e.srv.URL+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", c.contentType)
			resp, err := e.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Link") != "" {
				t.Errorf("status %d, Link %q", resp.StatusCode, resp.Header.Get("Link"))
			}
			if len(hints) != 1 || hints[0] != "</style.css>; rel=preload" {
				t.Errorf("1xx answers %q, want one with the Link", hints)
			}
			e.models.outcome()
		})
	}
}

// Each event of a stream reaches the client before the engine sends the
// next: the headers and every write are flushed.
func TestForward_StreamFlushed(t *testing.T) {
	next := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		for _, ev := range []string{"data: 1\n\n", "data: 2\n\n", "data: [DONE]\n\n"} {
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}, Options{})
	resp, err := e.client.Post(e.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m1","stream":true}`))
	if err != nil { // the headers came before any event
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// An event held back would block the read for good: the bound fails it.
	defer time.AfterFunc(10*time.Second, func() { resp.Body.Close() }).Stop()
	br := bufio.NewReader(resp.Body)
	for _, want := range []string{"data: 1", "data: 2", "data: [DONE]"} {
		next <- struct{}{}
		line, err := br.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != want {
			t.Fatalf("read %q, %v; want %q", line, err, want)
		}
		_, _ = br.ReadString('\n')
	}
	if o := e.models.outcome(); o.Cancelled {
		t.Errorf("outcome %+v", o)
	}
}

// A request that asks for a protocol upgrade is switched through to the
// engine, which then talks on the same connection.
func TestForward_Upgrade(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" || r.Header.Get("Cookie") != "" || r.Header.Get("X-Forwarded-For") == "" {
			http.Error(w, "bad upgrade request", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = brw.WriteString("echo: " + line)
		_ = brw.Flush()
	}, Options{})
	req, err := http.NewRequest("GET", e.srv.URL+"/upstream/m1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	req.Header.Set("Cookie", "session=1")
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatal("101 body not writable")
	}
	if _, err := io.WriteString(rw, "hello\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(rw).ReadString('\n')
	if err != nil || line != "echo: hello\n" {
		t.Errorf("read %q, %v", line, err)
	}
	rw.Close()
	e.models.outcome()
}
