package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// formBody builds a multipart form with fields and one file part, in the
// order given: a field name "@file" stands for the file.
func formBody(t testing.TB, order []string, fields map[string]string, file []byte) (body []byte, contentType string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	// Fixed, so the same form is the same bytes.
	w.SetBoundary("napd-test-boundary-0123456789")
	for _, name := range order {
		if name == "@file" {
			fw, err := w.CreateFormFile("file", "speech.wav")
			if err != nil {
				t.Fatal(err)
			}
			fw.Write(file)
			continue
		}
		w.WriteField(name, fields[name])
	}
	w.Close()
	return b.Bytes(), w.FormDataContentType()
}

func TestScanForm(t *testing.T) {
	file := bytes.Repeat([]byte("RIFF\r\n--not-the-boundary\r\n"), 5000)
	cases := []struct {
		name   string
		order  []string
		stream bool
	}{
		{"model first", []string{"model", "@file"}, false},
		{"model after the file", []string{"@file", "language", "model"}, false},
		{"stream before model", []string{"stream", "@file", "model"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body, ct := formBody(t, c.order, map[string]string{"model": "whisper-1", "language": "en", "stream": "true"}, file)
			_, params, _ := mime.ParseMediaType(ct)
			f, err := scanForm(bytes.NewReader(body), params["boundary"])
			if err != nil {
				t.Fatal(err)
			}
			if f.model != "whisper-1" || f.stream != c.stream || string(body[f.at.start:f.at.end]) != "whisper-1" {
				t.Errorf("form %+v, value at span %q", f, body[f.at.start:f.at.end])
			}
		})
	}

	raw := func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }
	bad := []struct {
		name, body string
		err        string // "" = io.EOF or io.ErrUnexpectedEOF
	}{
		{"no model", raw("--b\nContent-Disposition: form-data; name=\"x\"\n\n1\n--b--\n"), "no \"model\" field"},
		{"empty model", raw("--b\nContent-Disposition: form-data; name=\"model\"\n\n\n--b--\n"), "empty"},
		{"truncated in a file", raw("--b\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\n\nabc"), ""},
		{"truncated in the model", raw("--b\nContent-Disposition: form-data; name=\"model\"\n\nwhisp"), ""},
		{"no boundary at all", "just text", ""},
		{"bad line after boundary", raw("--bxx\nContent-Disposition: form-data; name=\"model\"\n\nm\n--b--\n"), "not followed by CRLF"},
		{"model too long", raw("--b\nContent-Disposition: form-data; name=\"model\"\n\n" + strings.Repeat("m", maxFormValue+1) + "\n--b--\n"), "longer than"},
		{"headers too long", raw("--b\nX: " + strings.Repeat("h", maxPartHeader) + "\n\nm\n--b--\n"), "headers are longer"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			_, err := scanForm(strings.NewReader(c.body), "b")
			var fe errForm
			switch {
			case c.err == "" && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF):
				t.Errorf("err %v, want EOF", err)
			case c.err != "" && (!errors.As(err, &fe) || !strings.Contains(err.Error(), c.err)):
				t.Errorf("err %v, want a form error containing %q", err, c.err)
			}
		})
	}

	// A preamble, transport padding and a part without headers are all
	// allowed before the model.
	body := raw("preamble\n--b  \n\nno headers\n--b\nContent-Disposition: form-data; name=model\n\nm1\n--b--\n")
	f, err := scanForm(strings.NewReader(body), "b")
	if err != nil || f.model != "m1" || body[f.at.start:f.at.end] != "m1" {
		t.Errorf("scanForm = %+v, %v", f, err)
	}
}

func FuzzScanForm(f *testing.F) {
	body, ct := formBody(f, []string{"@file", "model"}, map[string]string{"model": "m1"}, []byte("data"))
	_, params, _ := mime.ParseMediaType(ct)
	f.Add(body, params["boundary"])
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n--b--\r\n"), "b")
	f.Add([]byte("--b\r\n\r\n\r\n--b\r\n"), "b")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		if boundary == "" || len(boundary) > 70 {
			return
		}
		got, err := scanForm(bytes.NewReader(body), boundary)
		if err != nil {
			return
		}
		// The span is where the model lies in the raw bytes, and ends
		// at a delimiter.
		if got.at.start < 0 || got.at.end > len(body) || string(body[got.at.start:got.at.end]) != got.model || got.model == "" {
			t.Fatalf("model %q at %+v in %q", got.model, got.at, body)
		}
		if !bytes.HasPrefix(body[got.at.end:], []byte("\r\n--"+boundary)) {
			t.Fatalf("model %q does not end at a delimiter", got.model)
		}
	})
}

// formEngine records each upload it gets, parsed, and answers JSON.
type formEngine struct {
	mu      sync.Mutex
	bodies  [][]byte
	models  []string
	started chan struct{} // closed when the first upload's head arrived
	once    sync.Once
}

func newFormEngine() *formEngine { return &formEngine{started: make(chan struct{})} }

func (e *formEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	head := make([]byte, 1)
	if _, err := io.ReadFull(r.Body, head); err == nil {
		e.once.Do(func() { close(e.started) })
	}
	rest, err := io.ReadAll(r.Body)
	if err != nil {
		return // cut upload
	}
	body := append(head, rest...)
	_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	form, err := multipart.NewReader(bytes.NewReader(body), params["boundary"]).ReadForm(1 << 20)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	defer form.RemoveAll()
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	e.models = append(e.models, form.Value["model"][0])
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"text":"ok","model":"`+form.Value["model"][0]+`"}`)
}

func (e *formEngine) got() ([][]byte, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bodies, e.models
}

func postForm(t *testing.T, e *env, path string, body io.Reader, ct string, length int64) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+path, body)
	req.Header.Set("Content-Type", ct)
	req.ContentLength = length
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// The model comes first: the engine gets the upload while the client is
// still sending it, so the gateway holds none of it. On a dedicated socket
// and through /upstream/ the model is known and the form streams as well.
func TestGateway_FormIsStreamedToTheEngine(t *testing.T) {
	eng := newFormEngine()
	e := newEnv(t, eng.ServeHTTP, Options{MaxBody: 64 << 20})
	dedicated := newServer(t, e.gw.ModelHandler("m2"))
	file := bytes.Repeat([]byte{0xAB}, 4<<20)
	body, ct := formBody(t, []string{"model", "@file"}, map[string]string{"model": "a1"}, file)
	for i, url := range []string{e.srv.URL + "/v1/audio/transcriptions", dedicated + "/v1/audio/transcriptions", e.srv.URL + "/upstream/m2/v1/audio/transcriptions"} {
		eng.started = make(chan struct{})
		eng.once = sync.Once{}
		pr, pw := io.Pipe()
		go func() {
			pw.Write(body[:256<<10])
			// The rest only once the engine has the head: a gateway that
			// buffered the upload would wait here for ever (and the test
			// fail on its deadline).
			select {
			case <-eng.started:
				pw.Write(body[256<<10:])
				pw.Close()
			case <-time.After(30 * time.Second):
				pw.CloseWithError(errors.New("the engine got nothing before the upload ended"))
			}
		}()
		req, _ := http.NewRequest("POST", url, pr)
		req.Header.Set("Content-Type", ct)
		req.ContentLength = int64(len(body))
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", url, resp.StatusCode, b)
		}
		bodies, _ := eng.got()
		if len(bodies) != i+1 || !bytes.Equal(bodies[i], body) {
			t.Errorf("%s: engine got %d bodies, the last byte-identical: %v", url, len(bodies), len(bodies) == i+1 && bytes.Equal(bodies[i], body))
		}
		if o := e.models.outcome(); o.Cancelled {
			t.Errorf("%s: outcome %+v", url, o)
		}
	}
	a := e.models.admitted()
	if len(a) != 3 || a[0].Model != "m1" || a[1].Model != "m2" || a[2].Model != "m2" {
		t.Errorf("admissions %+v", a)
	}
}

// The model comes after a file larger than the spool's memory: the head
// is spooled to an unnamed file, never all in memory, and the engine
// still gets the body byte for byte; with served_name, only the model
// field's value differs.
func TestGateway_FormModelAfterFileIsSpooledToAnUnnamedFile(t *testing.T) {
	for _, served := range []string{"", "openai/whisper-large-v3"} {
		eng := newFormEngine()
		dir := t.TempDir()
		e := newEnv(t, eng.ServeHTTP, Options{MaxBody: 64 << 20, SpoolDir: dir})
		e.models.served = served
		type spooled struct {
			mem  int
			disk int64
		}
		got := make(chan spooled, 1)
		e.gw.spooled = func(mem int, disk int64) {
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("spool dir holds %v", entries)
			}
			got <- spooled{mem, disk}
		}
		file := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
		body, ct := formBody(t, []string{"@file", "response_format", "model"}, map[string]string{"model": "a1", "response_format": "json"}, file)
		// Chunked: the gateway cannot know the size in advance.
		resp, b := postForm(t, e, "/v1/audio/translations", io.MultiReader(bytes.NewReader(body)), ct, -1)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		s := <-got
		if s.mem > spoolMemory || s.disk < int64(len(file))-spoolMemory {
			t.Errorf("spool held %d bytes in memory, %d on disk; want at most %d in memory", s.mem, s.disk, spoolMemory)
		}
		bodies, models := eng.got()
		want, wantModel := body, "a1"
		if served != "" {
			want, wantModel = bytes.Replace(body, []byte("\r\n\r\na1\r\n"), []byte("\r\n\r\n"+served+"\r\n"), 1), served
			if string(b) != `{"text":"ok","model":"a1"}` {
				t.Errorf("answer %s: model not mapped back", b)
			}
		}
		if len(bodies) != 1 || !bytes.Equal(bodies[0], want) || models[0] != wantModel {
			t.Errorf("served %q: engine got model %v, body as expected: %v", served, models, len(bodies) == 1 && bytes.Equal(bodies[0], want))
		}
		e.models.outcome()
	}
}

func TestGateway_FormMaxBodyAndErrors(t *testing.T) {
	eng := newFormEngine()
	e := newEnv(t, eng.ServeHTTP, Options{MaxBody: 1 << 20})
	big := bytes.Repeat([]byte("x"), 2<<20)

	// Announced too large: refused before a byte is read.
	body, ct := formBody(t, []string{"model", "@file"}, map[string]string{"model": "m1"}, big)
	resp, b := postForm(t, e, "/v1/audio/transcriptions", bytes.NewReader(body), ct, int64(len(body)))
	wantError(t, resp, b, 413, "request_too_large")

	// Chunked, too large after the model was read and the engine admitted:
	// still 413, and the engine's request is cut.
	resp, b = postForm(t, e, "/v1/audio/transcriptions", io.MultiReader(bytes.NewReader(body)), ct, -1)
	wantError(t, resp, b, 413, "request_too_large")
	if o := e.models.outcome(); !o.Cancelled {
		t.Errorf("outcome %+v, want cancelled", o)
	}
	// Chunked, model after a file beyond max_body: 413 while spooling.
	body, ct = formBody(t, []string{"@file", "model"}, map[string]string{"model": "m1"}, big)
	resp, b = postForm(t, e, "/v1/audio/transcriptions", io.MultiReader(bytes.NewReader(body)), ct, -1)
	wantError(t, resp, b, 413, "request_too_large")

	body, ct = formBody(t, []string{"@file"}, nil, []byte("abc"))
	resp, b = postForm(t, e, "/v1/audio/transcriptions", bytes.NewReader(body), ct, int64(len(body)))
	wantError(t, resp, b, 400, "invalid_form")
	body, ct = formBody(t, []string{"model", "@file"}, map[string]string{"model": "nope"}, []byte("abc"))
	resp, b = postForm(t, e, "/v1/audio/transcriptions", bytes.NewReader(body), ct, int64(len(body)))
	wantError(t, resp, b, 404, "model_not_found")
	resp, b = postForm(t, e, "/v1/audio/transcriptions", strings.NewReader("x"), "multipart/form-data", 1)
	wantError(t, resp, b, 400, "invalid_form")
	if bodies, _ := eng.got(); len(bodies) != 0 {
		t.Errorf("the engine got %d complete uploads", len(bodies))
	}
	if a := e.models.admitted(); len(a) != 1 {
		t.Errorf("admissions %+v, want only the chunked one", a)
	}
}

// A client that stops sending mid-upload, after admission, gets 504 at
// the deadline, or 408 when the body's idle bound runs out first; either
// way the lease is released as cancelled.
func TestGateway_FormSlowUploadIs504Or408(t *testing.T) {
	for _, c := range []struct {
		opts   Options
		status int
		code   string
	}{
		{Options{RequestTimeout: 300 * time.Millisecond}, 504, "timeout"},
		{Options{RequestTimeout: time.Minute, BodyTimeout: 300 * time.Millisecond}, 408, "body_timeout"},
	} {
		eng := newFormEngine()
		e := newEnv(t, eng.ServeHTTP, c.opts)
		body, ct := formBody(t, []string{"model", "@file"}, map[string]string{"model": "m1"}, make([]byte, 1<<20))
		pr, pw := io.Pipe()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		go func() {
			pw.Write(body[:100<<10])
			// And then nothing, until the test is over (or has failed).
			<-ctx.Done()
			pw.Close()
		}()
		req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/audio/transcriptions", pr)
		req.Header.Set("Content-Type", ct)
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		wantError(t, resp, b, c.status, c.code)
		if o := e.models.outcome(); !o.Cancelled {
			t.Errorf("outcome %+v", o)
		}
	}
}

// An Idempotency-Key is bound to the whole form, file included: the same
// key with another file is another request.
func TestGateway_FormIdempotencyKeyCoversTheFile(t *testing.T) {
	eng := newFormEngine()
	e := newEnv(t, eng.ServeHTTP, Options{})
	send := func(file string) string {
		body, ct := formBody(t, []string{"model", "@file"}, map[string]string{"model": "m1"}, []byte(file))
		req, _ := http.NewRequest("POST", e.srv.URL+"/v1/audio/transcriptions", bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		req.Header.Set(HeaderIdempotencyKey, "k1")
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		e.models.outcome()
		a := e.models.admitted()
		return a[len(a)-1].Fingerprint
	}
	first, again, other := send(strings.Repeat("a", 300<<10)), send(strings.Repeat("a", 300<<10)), send(strings.Repeat("a", 300<<10)+"b")
	if first == "" || first != again || first == other {
		t.Errorf("fingerprints %q, %q (same form), %q (another file)", first, again, other)
	}
	if bodies, _ := eng.got(); len(bodies) != 3 || len(bodies[2]) < 300<<10 {
		t.Errorf("engine got %d bodies", len(bodies))
	}
}

// A scoped key's model patterns hold for the form's model field too, and
// Anthropic-style x-api-key is accepted on forms like anywhere.
func TestGateway_FormHonoursKeyScope(t *testing.T) {
	eng := newFormEngine()
	e := newEnv(t, eng.ServeHTTP, Options{APIKeys: mustKeys(t, "bob:sk-2 models=m2\n")})
	for _, c := range []struct {
		model  string
		status int
	}{{"m1", 403}, {"a1", 403}, {"m2", 200}} {
		body, ct := formBody(t, []string{"@file", "model"}, map[string]string{"model": c.model}, []byte("abc"))
		req, _ := http.NewRequest("POST", e.srv.URL+"/v1/audio/transcriptions", bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		req.Header.Set("X-Api-Key", "sk-2")
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("model %s: status %d, want %d: %s", c.model, resp.StatusCode, c.status, b)
		}
	}
	if _, models := eng.got(); len(models) != 1 || models[0] != "m2" {
		t.Errorf("engine got %v", models)
	}
}

func TestIsForm(t *testing.T) {
	for ct, want := range map[string]bool{
		"multipart/form-data; boundary=x":   true,
		"Multipart/Form-Data; boundary=x":   true,
		" multipart/form-data; boundary=x":  true,
		"multipart/form-data":               true, // refused later: no boundary
		"application/json":                  false,
		"":                                  false,
		"multipart/mixed; boundary=x":       false,
		"text/plain; x=multipart/form-data": false,
	} {
		r := httptest.NewRequest("POST", "/v1/audio/transcriptions", nil)
		r.Header.Set("Content-Type", ct)
		if _, ok := isForm(r); ok != want {
			t.Errorf("isForm(%q) = %v, want %v", ct, ok, want)
		}
	}
}
