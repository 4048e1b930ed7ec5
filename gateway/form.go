package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/textproto"
	"strings"
	"sync/atomic"
)

// A multipart/form-data POST (an audio transcription, an image edit) is
// routed by its `model` field without holding the upload in memory: the
// gateway reads the form only up to the end of that field, keeping what
// it read in a spool, and after admission sends the spool followed by the
// rest of the client's body, still unread, to the engine. A form whose
// model comes after a large file part is spooled to an unnamed file (see
// spool.go); the whole body stays within max_body.

// Bounds of what the gateway reads of a form to route it.
const (
	formBuffer    = 64 << 10 // read-ahead while looking for the model
	maxPartHeader = 16 << 10 // the header block of one part
	maxFormValue  = 4 << 10  // the model (or stream) field's value
)

// errForm is a form the gateway cannot route: a 400.
type errForm string

func (e errForm) Error() string { return string(e) }

// isForm reports whether r's body is multipart/form-data and returns its
// boundary ("" with ok when the boundary is missing or invalid).
func isForm(r *http.Request) (boundary string, ok bool) {
	ct := headerValue(r.Header, "Content-Type")
	if ct == "" || notM(ct[0]) {
		// Not multipart (most requests: application/json), without
		// ParseMediaType's allocations.
		return "", false
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "multipart/form-data" {
		return "", false
	}
	b := params["boundary"]
	if len(b) > 70 || strings.ContainsAny(b, "\r\n") {
		b = ""
	}
	return b, true
}

// notM reports whether c is an ASCII letter other than m or M, which no
// media type "multipart/…" can begin with, space or not.
func notM(c byte) bool {
	c |= 0x20
	return 'a' <= c && c <= 'z' && c != 'm'
}

// forwardForm streams a multipart form to the engine. When route is set it
// finds the model in the form's model field first; otherwise (a dedicated
// socket, /upstream/) the model is known and nothing is read before
// admission. With an idempotency key, which is bound to the whole body,
// the upload is spooled whole before admission and sent from the spool.
func (c *call) forwardForm(ctx context.Context, r *http.Request, boundary, path, rawPath, key string, route bool) {
	if route && boundary == "" {
		c.fail(http.StatusBadRequest, "invalid_form", "multipart/form-data without a valid boundary")
		return
	}
	src, ok := c.openBody(ctx, r)
	if !ok {
		return
	}
	head := newSpool(c.g.opts.SpoolDir)
	defer func() {
		if c.g.spooled != nil {
			c.g.spooled(head.inMemory(), head.onDisk())
		}
		head.Close()
	}()
	var f form
	if route {
		var err error
		if f, err = scanForm(io.TeeReader(src, head), boundary); err != nil {
			c.formFailed(err, src.idleBound)
			return
		}
		model, ok := c.resolve(f.model)
		if !ok {
			return
		}
		c.model, c.requested, c.stream = model, f.model, f.stream
	}
	c.path, c.rawPath = path, rawPath
	var whole io.Reader
	if key != "" {
		if _, err := io.Copy(head, src); err != nil {
			c.formFailed(err, src.idleBound)
			return
		}
		src.done()
		whole = head.section(0, head.size)
	}
	length := r.ContentLength
	if length == 0 {
		length = -1 // a form is never empty: the length is unknown (chunked)
	}
	c.dispatch(ctx, r, &formUpload{c: c, head: head, at: f.at, rest: src, length: length}, key, whole)
}

// formFailed answers a form that could not be read up to what routing
// needs.
func (c *call) formFailed(err error, idle bool) {
	var bad errForm
	switch {
	case errors.As(err, &bad):
		c.fail(http.StatusBadRequest, "invalid_form", "multipart form: "+bad.Error())
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		c.fail(http.StatusBadRequest, "invalid_form", "multipart form ended before its \"model\" field")
	case errors.Is(err, errSpool):
		c.g.log.Error("spool upload", "error", err)
		c.fail(http.StatusInternalServerError, "internal_error", "napd could not hold the upload")
	case !c.bodyFailed(err, idle):
		c.abort()
	}
}

// formUpload is a form on its way to the engine: the head the gateway read
// (in the spool) and the rest of the client's body.
type formUpload struct {
	c      *call
	head   *spool
	at     span // the model field's value in head
	rest   *bodyReader
	length int64 // of the whole body; -1 when unknown
}

// attach sets the model field to e.served; a form has no JSON priority
// field, so e.priority is not sent.
func (u *formUpload) attach(out *http.Request, e bodyEdit) {
	served := e.served
	var parts []io.Reader
	n := u.length
	if served == "" {
		parts = []io.Reader{u.head.section(0, u.head.size)}
	} else {
		parts = []io.Reader{
			u.head.section(0, int64(u.at.start)),
			strings.NewReader(served),
			u.head.section(int64(u.at.end), u.head.size),
		}
		if n >= 0 {
			n += int64(len(served) - (u.at.end - u.at.start))
		}
	}
	parts = append(parts, u.rest)
	out.Body = &uploadBody{r: io.MultiReader(parts...), rest: u.rest, c: u.c}
	out.ContentLength = n
	// Not rewindable: the transport sends it once.
	out.GetBody = nil
}

// uploadBody is a streamed upload as the transport reads it: it lifts the
// read deadline after the client's last byte and remembers why a read
// failed, so the answer can say (413, 408, 504) rather than 502.
type uploadBody struct {
	r    io.Reader
	rest *bodyReader
	c    *call
	once atomic.Bool
}

// uploadFailure is a failed read of a streamed upload.
type uploadFailure struct {
	err  error
	idle bool // the idle bound ran out, not the deadline
}

func (b *uploadBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	switch {
	case err == io.EOF:
		if b.once.CompareAndSwap(false, true) {
			b.rest.done()
		}
	case err != nil:
		// Read on the transport's goroutine, while the handler may be in
		// the proxy's ErrorHandler: handed over atomically.
		b.c.uploadErr.CompareAndSwap(nil, &uploadFailure{err, b.rest.idleBound})
	}
	return n, err
}

func (b *uploadBody) Close() error { return nil }

// form is what routing needs of a form: its model field, where its value
// lies in the bytes read, and whether a stream field before it said true.
type form struct {
	model  string
	at     span
	stream bool
}

// formScanner reads a multipart body up to its model field. It tracks the
// offset of every byte it consumes, so the model's value can be found, and
// replaced, in the raw bytes.
type formScanner struct {
	br    *bufio.Reader
	fed   int64  // bytes br read from below
	delim []byte // CRLF "--" boundary
}

// pos is the offset of the next unconsumed byte.
func (s *formScanner) pos() int { return int(s.fed) - s.br.Buffered() }

// counter counts the bytes read through it into the scanner.
type counter struct {
	r io.Reader
	n *int64
}

func (c counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}

// scanForm reads src, a multipart/form-data body, up to the end of its
// model field (RFC 7578; CRLF line ends, as every client sends them).
func scanForm(src io.Reader, boundary string) (form, error) {
	s := &formScanner{delim: []byte("\r\n--" + boundary)}
	s.br = bufio.NewReaderSize(counter{src, &s.fed}, formBuffer)
	var f form
	// The first boundary may open the body, without the CRLF before it.
	if b, err := s.br.Peek(len(s.delim) - 2); err != nil {
		return f, err
	} else if bytes.Equal(b, s.delim[2:]) {
		_, _ = s.br.Discard(len(b))
	} else if err := s.skipPast(s.delim); err != nil {
		return f, err
	}
	for {
		name, err := s.partName()
		if err != nil {
			return f, err
		}
		switch name {
		case "model", "stream":
			start := s.pos()
			i, err := s.peekFor(s.delim, maxFormValue+len(s.delim))
			if errors.Is(err, errTooFar) {
				return f, errForm(fmt.Sprintf("the %q field is longer than %d bytes", name, maxFormValue))
			} else if err != nil {
				return f, err
			}
			b, _ := s.br.Peek(i)
			value := string(b)
			if name == "model" {
				if value == "" {
					return f, errForm("the \"model\" field is empty")
				}
				f.model, f.at = value, span{start, start + i}
				return f, nil
			}
			f.stream = value == "true"
			_, _ = s.br.Discard(i + len(s.delim))
		default:
			if err := s.skipPast(s.delim); err != nil {
				return f, err
			}
		}
	}
}

// partName reads what follows a boundary up to the part's content and
// returns the part's form name ("" for none).
func (s *formScanner) partName() (string, error) {
	b, err := s.br.Peek(2)
	if err != nil {
		return "", err
	}
	if string(b) == "--" {
		return "", errForm("no \"model\" field")
	}
	// Transport padding, then CRLF.
	for {
		b, err := s.br.Peek(1)
		if err != nil {
			return "", err
		}
		if b[0] != ' ' && b[0] != '\t' {
			break
		}
		_, _ = s.br.Discard(1)
	}
	if b, err := s.br.Peek(2); err != nil {
		return "", err
	} else if string(b) != "\r\n" {
		return "", errForm("a boundary line is not followed by CRLF")
	}
	_, _ = s.br.Discard(2)
	if b, err := s.br.Peek(2); err != nil {
		return "", err
	} else if string(b) == "\r\n" {
		_, _ = s.br.Discard(2) // a part without headers has no name
		return "", nil
	}
	i, err := s.peekFor([]byte("\r\n\r\n"), maxPartHeader)
	if errors.Is(err, errTooFar) {
		return "", errForm(fmt.Sprintf("a part's headers are longer than %d bytes", maxPartHeader))
	} else if err != nil {
		return "", err
	}
	block, _ := s.br.Peek(i + 4)
	h, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(block))).ReadMIMEHeader()
	_, _ = s.br.Discard(i + 4)
	if err != nil {
		return "", errForm("bad part headers: " + err.Error())
	}
	_, params, err := mime.ParseMediaType(h.Get("Content-Disposition"))
	if err != nil {
		return "", nil // not a named form field: skipped like any other
	}
	return params["name"], nil
}

var errTooFar = errors.New("separator not found within the bound")

// peekFor waits until sep is among the next limit bytes (limit at most the
// buffer's size) and returns its index, without consuming anything. It
// reads only as far as it must: a client that pauses right after its
// model field is not waited for.
func (s *formScanner) peekFor(sep []byte, limit int) (int, error) {
	from, n := 0, len(sep)
	for {
		buf, err := s.br.Peek(n)
		if i := bytes.Index(buf[from:], sep); i >= 0 {
			return from + i, nil
		}
		if err != nil {
			return 0, err
		}
		if len(buf) >= limit {
			return 0, errTooFar
		}
		from = max(0, len(buf)-len(sep)+1)
		// What is buffered already, or else wait for one more byte.
		n = min(limit, max(s.br.Buffered(), len(buf)+1))
	}
}

// skipPast consumes everything up to and including the next sep.
func (s *formScanner) skipPast(sep []byte) error {
	for {
		buf, err := s.br.Peek(max(s.br.Buffered(), len(sep)))
		if i := bytes.Index(buf, sep); i >= 0 {
			_, _ = s.br.Discard(i + len(sep))
			return nil
		}
		if err != nil {
			return err
		}
		// Keep a tail that may be the start of sep.
		_, _ = s.br.Discard(len(buf) - len(sep) + 1)
	}
}
