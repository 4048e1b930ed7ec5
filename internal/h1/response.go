package h1

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/napd/napd/internal/mono"
)

// response is the Server's http.ResponseWriter. An answer of unknown
// length up to pendingMax is held back and sent with a Content-Length;
// past that, or when flushed, it goes chunked, as net/http does.
type response struct {
	c      *serverConn
	req    *http.Request
	header http.Header
	head   *Head // the header, when a Head was handed over (TakeHead); header is nil then

	status    int   // 0 until WriteHeader
	cl        int64 // the declared Content-Length; -1: none
	committed bool  // the head is in the buffer
	chunked   bool
	noBody    bool // HEAD, 204, 304
	written   int64
	pending   []byte  // held back before the head, when cl < 0
	held      *[]byte // pending's buffer, from holds
	done      bool    // the handler returned

	closeAfter bool
	sayClose   bool  // the head's Connection is "close", not the handler's
	err        error // the first write error: the connection is done

	readDeadline, writeDeadline bool // the handler set one
}

var errAfterReturn = errors.New("h1: write after the handler returned")

// writers are the connections' write buffers, held only while a request
// is answered (not while a connection idles between requests).
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, bufSize) }}

// holds are the buffers answers of unknown length are held back in, each
// of pendingMax bytes (never grown: hold stays within it).
var holds = sync.Pool{New: func() any { b := make([]byte, 0, pendingMax); return &b }}

// Header is made when first asked for: a handler may hand one over
// instead (TakeHeader). A Head handed over becomes an http.Header here.
func (w *response) Header() http.Header {
	if w.header == nil {
		if w.head != nil {
			w.header, w.head = w.head.Header(), nil
		} else {
			w.header = make(http.Header)
		}
	}
	return w.header
}

// TakeHeader makes h the answer's header, as if the handler had set each
// of its fields, if the handler has not asked for one yet (Header) nor
// written the head; it reports whether it did. The handler gives h up: it
// is the answer's, Header's from then on. A proxy hands over its
// engine's answer's header so, rather than copying it field by field
// into a header made for it.
func (w *response) TakeHeader(h http.Header) bool {
	if w.header != nil || w.head != nil || w.status != 0 || w.done || h == nil {
		return false
	}
	w.header = h
	return true
}

// TakeHead is TakeHeader for an engine's answer's Head (RoundTripHead):
// its fields are written out in their order, with no http.Header made. A
// head that declares trailers (Trailer), or has no Content-Type (one would
// be sniffed from the body), is refused: those go as an http.Header
// (Head.Header).
func (w *response) TakeHead(h *Head) bool {
	if w.header != nil || w.head != nil || w.status != 0 || w.done || h == nil ||
		h.Has("Trailer") || !h.Has("Content-Type") {
		return false
	}
	w.head = h
	return true
}

// has, get, values and del read and change the answer's fields, in its
// Head or its http.Header; k is canonical.
func (w *response) has(k string) bool {
	if w.head != nil {
		return w.head.Has(k)
	}
	_, ok := w.header[k] // a nil value counts: it suppresses Date, as with net/http
	return ok
}

func (w *response) get(k string) string {
	if vv := w.values(k); len(vv) > 0 {
		return vv[0]
	}
	return ""
}

func (w *response) values(k string) []string {
	if w.head != nil {
		return w.head.Values(k)
	}
	return w.header[k]
}

func (w *response) del(k string) {
	if w.head != nil {
		w.head.Del(k)
	} else {
		delete(w.header, k)
	}
}

// each calls field with each of the answer's fields, a name and its
// values (a function, not an iterator: one that chose between two would
// be made on the heap, each time).
func (w *response) each(field func(k string, vs []string)) {
	if w.head != nil {
		w.head.each(field)
		return
	}
	for k, vs := range w.header {
		field(k, vs)
	}
}

func (w *response) WriteHeader(code int) {
	if w.done || w.status != 0 {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.interim(code)
		return
	}
	w.status = code
	w.noBody = w.req.Method == http.MethodHead || !bodyAllowed(code)
	if v := w.get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			w.cl = n
		} else {
			w.del("Content-Length")
		}
	}
}

// interim sends a 1xx answer at once (103 Early Hints), with the header as
// it is but for Content-Length (as net/http).
func (w *response) interim(code int) {
	bw := w.writer()
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(statusLine(code))
	bw.WriteString("\r\n")
	w.writeHeader(bw, nil)
	bw.WriteString("\r\n")
	w.fail(bw.Flush())
}

func (w *response) writer() *bufio.Writer {
	if w.c.bw == nil {
		w.c.bw = writers.Get().(*bufio.Writer)
		w.c.bw.Reset(&w.c.cw)
	}
	return w.c.bw
}

func (w *response) fail(err error) {
	if err != nil && w.err == nil {
		w.err = err
		w.closeAfter = true
	}
}

func (w *response) Write(p []byte) (int, error) {
	if w.done {
		return 0, errAfterReturn
	}
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.noBody {
		if !w.headAsGet() {
			return 0, http.ErrBodyNotAllowed
		}
		// Not sent, but held back as a GET's would be, for the head.
		if !w.committed {
			if len(w.pending)+len(p) <= pendingMax {
				w.hold(p)
				return len(p), nil
			}
			w.commit(false, p)
		}
		return len(p), nil
	}
	if w.cl >= 0 && w.written+int64(len(p)) > w.cl {
		return 0, http.ErrContentLength
	}
	if !w.committed {
		if w.cl < 0 && len(w.pending)+len(p) <= pendingMax {
			w.hold(p)
			return len(p), nil
		}
		w.commit(w.cl < 0, p)
	}
	w.written += int64(len(p))
	return w.body(p)
}

func (w *response) hold(p []byte) {
	if w.held == nil {
		w.held = holds.Get().(*[]byte)
		w.pending = (*w.held)[:0]
	}
	w.pending = append(w.pending, p...)
	w.written += int64(len(p))
}

// headAsGet: the answer to a HEAD whose status has a body in a GET's
// answer. Its head is the GET's, as with net/http: what the handler
// wrote, unsent, gives it a Content-Type, and, when it all came before
// the handler returned (and no trailers), a Content-Length.
func (w *response) headAsGet() bool {
	return w.req.Method == http.MethodHead && bodyAllowed(w.status)
}

// body writes p as the answer's body (one chunk when chunked).
func (w *response) body(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	bw := w.writer()
	if w.chunked {
		var size [16]byte
		bw.Write(strconv.AppendInt(size[:0], int64(len(p)), 16))
		bw.WriteString("\r\n")
	}
	n, err := bw.Write(p)
	if w.chunked && err == nil {
		_, err = bw.WriteString("\r\n")
	}
	w.fail(err)
	return n, err
}

// commit puts the head in the buffer, then whatever was held back. next
// is the body's first bytes after those, for a Content-Type sniffed when
// the handler set none (as net/http does).
func (w *response) commit(chunked bool, next []byte) {
	w.committed = true
	if w.cl < 0 {
		// Set after WriteHeader, which read none: not the answer's
		// (net/http ignores it too), which this server frames.
		w.del("Content-Length")
	}
	trailers := trailerOf(w.values("Trailer"))
	if !w.has("Content-Type") && (!w.noBody || w.headAsGet()) && w.get("Content-Encoding") == "" {
		first := w.pending
		if len(first) == 0 {
			first = next
		}
		if len(first) > 0 {
			w.Header().Set("Content-Type", http.DetectContentType(first[:min(len(first), 512)]))
		}
	}
	hasDate := w.has("Date")
	c := w.c
	saysClose := hasToken(w.values("Connection"), "close")
	if w.req.Close || c.s.DisableKeepAlives || c.s.shutting.Load() || !c.bodyDone && w.req.ContentLength > maxDiscard || saysClose {
		w.closeAfter = true
	}
	// A closing answer says so, whatever Connection the handler set
	// (net/http does the same).
	w.sayClose = w.closeAfter && !saysClose
	bw := w.writer()
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(statusLine(w.status))
	bw.WriteString("\r\n")
	// The fields first: writing them tells whether any is a trailer set
	// with http.TrailerPrefix, which the framing after them depends on.
	prefixed := w.writeHeader(bw, trailers)
	hasTrailers := len(trailers) > 0 || prefixed
	if w.noBody {
		chunked = false
	} else if w.cl < 0 && hasTrailers {
		// Trailers need the chunked framing, however small the body
		// (net/http does the same).
		chunked = true
	}
	w.chunked = chunked
	extra := 0
	if chunked {
		extra = 1
	} else if w.cl < 0 && (!w.noBody || w.headAsGet() && w.done && len(w.pending) > 0 && !hasTrailers) {
		w.cl = int64(len(w.pending))
		extra = 2
	}
	switch {
	case extra == 1:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case extra == 2:
		bw.WriteString("Content-Length: ")
		var n [20]byte
		bw.Write(strconv.AppendInt(n[:0], w.cl, 10))
		bw.WriteString("\r\n")
	}
	if !hasDate {
		// Written, not set in the header (as net/http does): no slice
		// to allocate for it.
		bw.WriteString("Date: ")
		bw.WriteString(date())
		bw.WriteString("\r\n")
	}
	if w.sayClose {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	if len(w.pending) > 0 {
		if !w.noBody {
			_, _ = w.body(w.pending)
		}
		w.pending = w.pending[:0]
	}
}

// writeHeader writes h's fields, but not those named in skip (trailers),
// hop-by-hop ones napd sets itself, trailers set with http.TrailerPrefix
// (it reports whether there are any), or names that are not tokens; a
// value with a line break has it as a space (net/http does the same).
func (w *response) writeHeader(bw *bufio.Writer, skip []string) (prefixed bool) {
	w.each(func(k string, vs []string) {
		switch k {
		case "Transfer-Encoding":
			return
		case "Trailer":
			if len(skip) == 0 {
				return
			}
		case "Connection":
			if w.sayClose {
				return
			}
		case "Content-Type":
			// No content to type (net/http leaves it out too).
			if w.status == http.StatusNotModified {
				return
			}
		case "Content-Length":
			// Status 0: a 1xx, which has no body to measure.
			if w.status == 0 || w.noBody && w.req.Method != http.MethodHead {
				return
			}
		}
		if strings.HasPrefix(k, http.TrailerPrefix) {
			prefixed = true
			return
		}
		if !validName(k) || slices.Contains(skip, k) {
			return
		}
		for _, v := range vs {
			bw.WriteString(k)
			bw.WriteString(": ")
			if strings.ContainsAny(v, "\r\n") {
				v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
			}
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	})
	return prefixed
}

// trailerOf lists the trailer fields the values of a Trailer field
// declare.
func trailerOf(declared []string) []string {
	var out []string
	for _, v := range declared {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, http.CanonicalHeaderKey(f))
			}
		}
	}
	return out
}

// FlushError sends what is buffered; an answer of unknown length goes
// chunked from here on.
func (w *response) FlushError() error {
	if w.done {
		return nil
	}
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	if !w.committed {
		w.commit(w.cl < 0, nil)
	}
	w.fail(w.writer().Flush())
	return w.err
}

// Flush implements http.Flusher.
func (w *response) Flush() { _ = w.FlushError() }

// SetReadDeadline and SetWriteDeadline let http.ResponseController bound
// the connection's reads (the body) and writes, for this request only.
// The deadline is in place before the next read (write) of the
// connection, and at once for one in progress.
func (w *response) SetReadDeadline(t time.Time) error {
	w.readDeadline = true
	return w.c.rd.to(t)
}

func (w *response) SetWriteDeadline(t time.Time) error {
	w.writeDeadline = true
	return w.c.wd.to(t)
}

// finish ends the answer after the handler returned: the head if none
// went out, the last chunk and the trailers, and one flush.
func (w *response) finish() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.done = true
	if w.err == nil {
		if !w.committed {
			w.commit(false, nil)
		}
		bw := w.writer()
		if w.chunked {
			bw.WriteString("0\r\n")
			w.writeTrailers(bw)
			bw.WriteString("\r\n")
		} else if w.cl >= 0 && w.written < w.cl && !w.noBody {
			w.closeAfter = true // short: the client must see it cut
		}
		w.fail(bw.Flush())
	} else if w.err == errPanicked && w.c.bw != nil {
		_ = w.c.bw.Flush()
	}
	if w.held != nil {
		holds.Put(w.held)
		w.held = nil
	}
	w.pending = nil
	if bw := w.c.bw; bw != nil {
		bw.Reset(nil)
		writers.Put(bw)
		w.c.bw = nil
	}
}

func (w *response) writeTrailers(bw *bufio.Writer) {
	declared := trailerOf(w.values("Trailer"))
	w.each(func(k string, vs []string) {
		name, prefixed := strings.CutPrefix(k, http.TrailerPrefix)
		if !prefixed && !slices.Contains(declared, k) {
			return
		}
		name = http.CanonicalHeaderKey(name)
		if !validName(name) {
			return
		}
		for _, v := range vs {
			if !validValue(v) {
				continue
			}
			bw.WriteString(name)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	})
}

// statusLine is "200 OK" for 200.
func statusLine(code int) string {
	if code >= 0 && code < len(statusLines) && statusLines[code] != "" {
		return statusLines[code]
	}
	return strconv.Itoa(code) + " " + http.StatusText(code)
}

// statusLines are the lines of the codes net/http names, by code (an
// index: a map lookup was 0.5 % of napd's own work).
var statusLines = func() (lines [600]string) {
	for code := range lines {
		if t := http.StatusText(code); t != "" {
			lines[code] = strconv.Itoa(code) + " " + t
		}
	}
	return lines
}()

// date is the Date header's value, made once a second. Within the second
// it is found by a reading of the monotonic clock alone: time.Now reads
// the wall clock too.
func date() string {
	if d := dates.Load(); d != nil && mono.Now() < d.until {
		return d.s
	}
	now := time.Now()
	d := &dated{
		until: mono.Of(now) + time.Second - time.Duration(now.Nanosecond()),
		s:     now.UTC().Format(http.TimeFormat),
	}
	dates.Store(d)
	return d.s
}

type dated struct {
	until time.Duration // the end of its second, as a mono reading
	s     string
}

var dates atomic.Pointer[dated]
