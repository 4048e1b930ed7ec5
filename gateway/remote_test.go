package gateway

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lease"
	"github.com/napd/napd/internal/testca"
)

// remoteTickets makes e's tickets those of a remote model reached with tr
// at target, holding credential, and (servedBy) an overflow's.
func remoteTickets(e *env, target string, tr http.RoundTripper, credential http.Header, servedBy string) {
	u, err := url.Parse(target)
	if err != nil {
		e.t.Fatal(err)
	}
	remote := &Remote{Name: "cloud", Where: u.Host, Credential: credential}
	e.models.admit = func(context.Context, lease.Request) (*Ticket, error) {
		t := e.models.ticket(0)
		t.Target, t.Transport, t.Remote, t.ServedBy = u, tr, remote, servedBy
		return t, nil
	}
}

const chatM1 = `{"model":"m1","messages":[]}`

// The client's key never goes to a remote: with API keys on it is napd's
// (removed as for an engine), and napd's credential for the remote takes
// the place of whatever the client sent, in the header the remote wants.
// Without a credential and without keys the client's own passes, as it
// would to an engine. No X-Forwarded-* header leaves for a remote.
func TestRemote_CredentialNeverTheClients(t *testing.T) {
	keys, err := parseAPIKeys("keys", []byte("alice:sk-alice\n"))
	if err != nil {
		t.Fatal(err)
	}
	bearer := http.Header{"Authorization": {"Bearer sk-remote"}}
	anthropic := http.Header{"X-Api-Key": {"sk-remote"}}
	for _, c := range []struct {
		name       string
		keys       *APIKeys
		credential http.Header
		send       map[string]string
		want       map[string]string // header -> value upstream ("" = absent)
	}{
		{"keys on, bearer credential", keys, bearer,
			map[string]string{"Authorization": "Bearer sk-alice"},
			map[string]string{"Authorization": "Bearer sk-remote", "X-Api-Key": ""}},
		{"keys on, x-api-key credential", keys, anthropic,
			map[string]string{"X-Api-Key": "sk-alice"},
			map[string]string{"Authorization": "", "X-Api-Key": "sk-remote"}},
		{"keys off, napd holds a credential", nil, bearer,
			map[string]string{"Authorization": "Bearer sk-client", "X-Api-Key": "sk-client"},
			map[string]string{"Authorization": "Bearer sk-remote", "X-Api-Key": ""}},
		{"keys off, no credential", nil, nil,
			map[string]string{"Authorization": "Bearer sk-client"},
			map[string]string{"Authorization": "Bearer sk-client"}},
		{"keys on, no credential", keys, nil,
			map[string]string{"Authorization": "Bearer sk-alice"},
			map[string]string{"Authorization": ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng := &okEngine{}
			e := newEnv(t, eng.ServeHTTP, Options{APIKeys: c.keys})
			remoteTickets(e, e.engine.URL, NewRemoteTransport(RemoteTransportOptions{MaxIdle: 2}), c.credential, "cloud")
			resp, body := e.do("POST", "/v1/chat/completions", chatM1, c.send)
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedBy) != "cloud" {
				t.Fatalf("status %d, %s %q: %s", resp.StatusCode, HeaderServedBy, resp.Header.Get(HeaderServedBy), body)
			}
			e.models.outcome()
			got := eng.seen()[0].header
			for k, v := range c.want {
				if got.Get(k) != v {
					t.Errorf("upstream %s = %q, want %q", k, got.Get(k), v)
				}
			}
			for k := range got {
				if strings.HasPrefix(k, "X-Forwarded-") {
					t.Errorf("upstream got %s: %q", k, got.Get(k))
				}
			}
			if o := e.next(); o.ServedBy != "cloud" || o.Model != "m1" {
				t.Errorf("observation %+v, want m1 served by cloud", o)
			}
		})
	}
}

// A remote's own X-Queue-Depth (another napd's) is not passed on: the
// client is told this napd's.
func TestRemote_QueueDepthIsNapds(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderQueueDepth, "17")
		_, _ = w.Write([]byte(`{}`))
	}, Options{})
	remoteTickets(e, e.engine.URL, NewRemoteTransport(RemoteTransportOptions{}), nil, "")
	resp, _ := e.do("POST", "/v1/chat/completions", chatM1, nil)
	if got := resp.Header.Get(HeaderQueueDepth); got != "3" || resp.Header.Get(HeaderServedBy) != "" {
		t.Errorf("X-Queue-Depth %q (want napd's 3), served by %q (not an overflow)", got, resp.Header.Get(HeaderServedBy))
	}
	e.models.outcome()
}

// TLS to a remote is verified: against the CA napd is given, it works;
// against another, the request fails fast with a 502 naming the remote
// and the certificate, and the remote never sees it.
func TestRemote_TLSVerified(t *testing.T) {
	ca, other := testca.New(t, "napd test CA"), testca.New(t, "another CA")
	served := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server("127.0.0.1")}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is what the test makes
	srv.StartTLS()
	t.Cleanup(srv.Close)

	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	remoteTickets(e, srv.URL, NewRemoteTransport(RemoteTransportOptions{RootCAs: ca.Pool()}), nil, "")
	if resp, body := e.do("POST", "/v1/chat/completions", chatM1, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the right CA: %d %s", resp.StatusCode, body)
	}
	e.models.outcome()

	remoteTickets(e, srv.URL, NewRemoteTransport(RemoteTransportOptions{RootCAs: other.Pool()}), nil, "")
	resp, body := e.do("POST", "/v1/chat/completions", chatM1, nil)
	wantError(t, resp, body, http.StatusBadGateway, "engine_unreachable")
	host := strings.TrimPrefix(srv.URL, "https://")
	if want := "cannot reach remote model cloud (" + host + "): its TLS certificate is not signed by a trusted authority"; !strings.Contains(string(body), want) {
		t.Errorf("body %s, want %q", body, want)
	}
	if o := e.models.outcome(); o.Fault != FaultFailed || !o.Cancelled {
		t.Errorf("outcome %+v, want a failed, incomplete request", o)
	}
	if served != 1 {
		t.Errorf("the remote served %d requests, want only the one with the right CA", served)
	}
	for _, bad := range []string{"sk-", "BEGIN"} {
		if strings.Contains(e.logs.String(), bad) {
			t.Errorf("the log holds %q", bad)
		}
	}
}

// A remote that hangs is cut at the request's deadline, with a 504 naming
// it; one that refuses the connection is a 502 naming it at once.
func TestRemote_FailsFastNamingTheRemote(t *testing.T) {
	hang := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hang); hung.Close() })
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{})
	remoteTickets(e, hung.URL, NewRemoteTransport(RemoteTransportOptions{}), nil, "")
	start := time.Now()
	resp, body := e.do("POST", "/v1/chat/completions", chatM1, map[string]string{HeaderRequestTimeout: "300ms"})
	wantError(t, resp, body, http.StatusGatewayTimeout, "timeout")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the 504 came after %s", took)
	}
	if !strings.Contains(string(body), "remote model cloud (") || !strings.Contains(string(body), "did not answer within the request deadline") {
		t.Errorf("504 body %s", body)
	}
	e.models.outcome()

	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	remoteTickets(e, closedURL, NewRemoteTransport(RemoteTransportOptions{}), nil, "")
	resp, body = e.do("POST", "/v1/chat/completions", chatM1, nil)
	wantError(t, resp, body, http.StatusBadGateway, "engine_unreachable")
	if !strings.Contains(string(body), "remote model cloud (") || !strings.Contains(string(body), "refused the connection") {
		t.Errorf("502 body %s", body)
	}
	if o := e.models.outcome(); o.Fault != FaultRefused {
		t.Errorf("outcome %+v, want refused", o)
	}
}

// A request that names its model may be served by another model (it is
// renamed there); /upstream/MODEL/… and a model's own socket reach that
// model's engine and may not.
func TestAdmission_ByName(t *testing.T) {
	e := newEnv(t, (&okEngine{}).ServeHTTP, Options{Routes: []Route{{Method: "GET", Path: "/props"}}})
	for _, c := range []struct {
		method, path, body string
		want               bool
	}{
		{"POST", "/v1/chat/completions", chatM1, true},
		{"GET", "/props?model=m1", "", true},
		{"POST", "/upstream/m1/v1/chat/completions", chatM1, false},
	} {
		if resp, body := e.do(c.method, c.path, c.body, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", c.method, c.path, resp.StatusCode, body)
		}
		e.models.outcome()
		got := e.models.admitted()
		if a := got[len(got)-1]; a.ByName != c.want {
			t.Errorf("%s %s: ByName %v, want %v", c.method, c.path, a.ByName, c.want)
		}
	}
	dedicated := serveGateway(t, e.gw.ModelHandler("m1"), nil)
	resp, err := http.Post(dedicated.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatM1))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.models.outcome()
	got := e.models.admitted()
	if got[len(got)-1].ByName {
		t.Error("a request on the model's own socket may be served elsewhere")
	}
}
