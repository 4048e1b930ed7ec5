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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/internal/h1"
)

// The engine's request and answer lose their hop-by-hop headers (those
// Connection names too), keep TE: trailers, carry napd's forwarding
// headers and no default User-Agent; trailers come through. Served by
// napd's h1 server, whose answer takes over the engine's answer's header.
func TestForward_Headers(t *testing.T) {
	for _, c := range []struct {
		name        string
		own, served bool
	}{{"net/http", false, false}, {"h1", true, false}, {"h1 served by h1", true, true}} {
		own := c.own
		t.Run(c.name, func(t *testing.T) {
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
			if own {
				e.models.transport = &h1.Transport{}
			}
			base := e.srv.URL
			if c.served {
				base = serveByH1(t, e.gw)
			}
			req, err := http.NewRequest("POST", base+"/v1/completions?a=1;b=2", strings.NewReader(`{"model":"m1"}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header["User-Agent"] = []string{""} // none
			req.Header.Set("Connection", "X-Hop, keep-alive")
			req.Header.Set("X-Hop", "1")
			if !c.served {
				// napd's h1 server hands a request with TE to net/http's.
				req.Header.Set("Te", "trailers")
			}
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
			for _, k := range []string{"X-Hop", "Cookie", "Proxy-Authorization", "Forwarded", "User-Agent", "Keep-Alive"} {
				if v, ok := h[k]; ok {
					t.Errorf("engine got %s: %q", k, v)
				}
			}
			want := map[string]string{
				"Te": "trailers", "X-Forwarded-For": "127.0.0.1", "X-Forwarded-Host": strings.TrimPrefix(base, "http://"),
				"X-Forwarded-Proto": "http", "X-Kept": "yes", "Host": e.models.target.Host,
			}
			if c.served {
				delete(want, "Te")
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
		})
	}
}

// Sent by napd's h1 Transport and answered by its h1 Server, the engine's
// answer's fields go on as they came (an h1.Head, no header map), in
// their order, edited as any answer is: hop-by-hop fields and those
// Connection names dropped, an engine's 503 sent as 502 with
// X-Napd-Engine-Status, X-Queue-Depth added.
func TestForward_HeadPassedOn(t *testing.T) {
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
	e.models.transport = &h1.Transport{}
	nc, err := net.Dial("tcp", strings.TrimPrefix(serveByH1(t, e.gw), "http://"))
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
		name, _, _ := strings.Cut(line, ":")
		names = append(names, name)
	}
	if err != nil {
		t.Fatal(err)
	}
	rest, _ := br.Peek(len(`{"error":"busy"}`))
	if !strings.HasPrefix(status, "HTTP/1.1 502 ") || string(rest) != `{"error":"busy"}` {
		t.Fatalf("%q %q", status, rest)
	}
	// The engine (net/http's server) writes its handler's fields sorted,
	// then Date and Content-Length; napd's come after.
	want := []string{"Content-Type", "X-Multi", "X-Multi", "Date", "Content-Length", HeaderEngineStatus, HeaderQueueDepth}
	if !slices.Equal(names, want) {
		t.Errorf("fields %q, want %q", names, want)
	}
	e.models.outcome()
}

// An engine's 1xx answer reported by the transport (net/http's) reaches
// the client before the final one: also where napd's h1 hands the request
// to net/http's Transport (a streamed upload), while for the requests h1
// sends itself the gateway attaches no trace (sentByH1).
func TestForward_Interim(t *testing.T) {
	form, formType := formBody(t, []string{"model", "@file"}, map[string]string{"model": "m1"}, []byte("RIFF"))
	for _, c := range []struct {
		name, path, contentType, body string
		h1                            bool
	}{
		{"net/http", "/v1/completions", "application/json", `{"model":"m1"}`, false},
		{"h1 streamed upload", "/v1/audio/transcriptions", formType, string(form), true},
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
			if c.h1 {
				e.models.transport = &h1.Transport{}
			}
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
	e.models.transport = &h1.Transport{}
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

// serveByH1 serves gw by napd's h1 server, as the agent does, and returns
// its URL.
func serveByH1(t *testing.T, gw *Gateway) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &h1.Server{Handler: gw.Handler(), Fallback: &http.Server{Handler: gw.Handler()}}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}
