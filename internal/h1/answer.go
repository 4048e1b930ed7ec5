package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
)

// An engine's answer is read here rather than by http.ReadResponse, whose
// net/textproto reader copies every line and value into strings of their
// own and was about 5 % of the proxy's CPU. This reader copies the head
// once: header names and values are pieces of one string, and the values
// share one []string backing. The framing of the body follows net/http's
// (transfer.go) rule for rule, and it accepts no answer that net/http
// refuses; it refuses some net/http takes, none of which a sane engine
// sends: obsolete line folding, a space before a header's colon, a status
// code outside 100-999 or not three digits, a version other than HTTP/1.x,
// control characters in the reason phrase.

var (
	errFolded        = errors.New("h1: the engine's answer folds a header line (obsolete)")
	errTrailerTooBig = errors.New("h1: the engine's trailer does not fit the read buffer")
)

// headStack is the size of the stack buffer an answer's head is parsed in;
// larger heads take a heap copy.
const headStack = 1 << 10

// readAnswer reads the head of req's answer from br and frames its body,
// as http.ReadResponse does. asHead: its fields are read into the
// answer's Head, not an http.Header (resp.Header is nil).
func readAnswer(br *bufio.Reader, req *http.Request, asHead bool) (*answer, error) {
	var stack [headStack]byte
	raw, err := readHead(br, stack[:0])
	if err != nil {
		return nil, err
	}
	nl := bytes.IndexByte(raw, '\n') // readHead's head has at least one
	fields, err := checkFields(raw[nl+1:])
	if err != nil {
		return nil, err
	}
	head := string(raw)
	a := &answer{resp: http.Response{Request: req}}
	resp := &a.resp
	if err := parseStatus(resp, strings.TrimSuffix(head[:nl], "\r")); err != nil {
		return nil, err
	}
	var fs fieldSet
	if asHead {
		if err := a.head.init(head[nl+1:], fields, a.names[:0], a.values[:0]); err != nil {
			return nil, err
		}
		fs = &a.head
	} else {
		if resp.Header, err = buildFields(head[nl+1:], fields, a.values[:]); err != nil {
			return nil, err
		}
		fs = HeaderFields(resp.Header)
	}
	if err := frame(resp, fs, br, &a.body); err != nil {
		return nil, err
	}
	return a, nil
}

// answer is an answer and its body, the Transport's body over that, its
// Head when read as one, and the names and values of a small header, made
// in one allocation.
type answer struct {
	resp   http.Response
	body   answerBody
	tb     body
	head   Head
	names  [answerValues]string
	values [answerValues]string
}

// answerValues is the most header fields an answer holds in itself: an
// engine's answers have fewer (uvicorn's: about 5), with room for the
// few a proxy adds to a Head.
const answerValues = 10

// readHead reads a head, up to and with its first empty line, from br
// into scratch (grown if need be), which it returns.
func readHead(br *bufio.Reader, scratch []byte) ([]byte, error) {
	for {
		// Most heads arrive whole in one read: they are found in the
		// buffer and copied once.
		b, _ := br.Peek(br.Buffered())
		if end := headEnd(b); end > 0 {
			scratch = append(scratch, b[:end]...)
			_, _ = br.Discard(end)
			return scratch, nil
		}
		if len(b) == br.Size() {
			break
		}
		if _, err := br.Peek(len(b) + 1); err != nil {
			return nil, unexpectedEOF(err)
		}
	}
	// Larger than the buffer: line by line.
	atStart := true
	for {
		line, err := br.ReadSlice('\n')
		scratch = append(scratch, line...)
		if err == bufio.ErrBufferFull {
			atStart = false
			continue
		}
		if err != nil {
			return nil, unexpectedEOF(err)
		}
		if atStart && (len(line) == 1 || len(line) == 2 && line[0] == '\r') {
			return scratch, nil
		}
		atStart = true
	}
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// headEnd is the length of the head in b, up to and with its first empty
// line (LF or CRLF); 0 when b holds no empty line.
func headEnd(b []byte) int {
	for i := 0; i < len(b); {
		switch {
		case b[i] == '\n':
			return i + 1
		case b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n':
			return i + 2
		}
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0
		}
		i += j + 1
	}
	return 0
}

// nextLine cuts the first line of b (a head's bytes or its string), ended
// by LF or CRLF, from the rest.
func nextLine[T string | []byte](b T) (line, rest T) {
	var i int
	switch v := any(b).(type) {
	case string:
		i = strings.IndexByte(v, '\n')
	case []byte:
		i = bytes.IndexByte(v, '\n')
	}
	if i >= 0 {
		line, rest = b[:i], b[i+1:]
	} else {
		line = b
	}
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, rest
}

// checkFields checks the header lines of b, up to the first empty line,
// as net/textproto's reader does (their values: buildFields), but refuses
// obsolete line folding and names with spaces; it puts the names in
// canonical form in place and counts the lines.
func checkFields(b []byte) (int, error) {
	n := 0
	for {
		var line []byte
		line, b = nextLine(b)
		if len(line) == 0 {
			return n, nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return 0, fmt.Errorf("%w: %q", errFolded, clip(line))
		}
		k, _, ok := bytes.Cut(line, []byte{':'})
		if !ok || !validName(string(k)) {
			return 0, fmt.Errorf("h1: malformed header line in the engine's answer: %q", clip(line))
		}
		canonicalName(k)
		n++
	}
}

// clip is the start of a bad line for its error: a copy, as the line may
// be on the stack.
func clip(b []byte) string { return string(b[:min(len(b), 80)]) }

// canonicalName puts the token k in canonical form, as
// http.CanonicalHeaderKey does: upper case first and after each '-', lower
// case elsewhere.
func canonicalName(k []byte) {
	upper := true
	for i, c := range k {
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		k[i] = c
		upper = c == '-'
	}
}

// buildFields makes the header of the n lines of s, which checkFields
// accepted, and checks their values: names and values are pieces of s,
// and the values of all names share one backing array, as net/textproto's
// reader does: room, when it holds n, or one made.
func buildFields(s string, n int, room []string) (http.Header, error) {
	h := make(http.Header, n)
	values := room
	if n > len(room) {
		values = make([]string, min(n, 1000)) // as textproto, a cap against overallocation
	}
	for {
		var line string
		line, s = nextLine(s)
		if line == "" {
			return h, nil
		}
		k, v := cutField(line)
		if !validValue(v) {
			return nil, malformedLine(line)
		}
		vv := h[k]
		if vv == nil && len(values) > 0 {
			vv, values = values[:1:1], values[1:]
			vv[0] = v
			h[k] = vv
		} else {
			h[k] = append(vv, v)
		}
	}
}

// cutField cuts a header line checkFields accepted into its name and its
// value, trimmed.
func cutField(line string) (k, v string) {
	k, v, _ = strings.Cut(line, ":")
	return k, trimOWS(v)
}

func malformedLine(line string) error {
	return fmt.Errorf("h1: malformed header line in the engine's answer: %q", line[:min(len(line), 80)])
}

// trimOWS trims spaces and tabs (strings.Trim's cutset costs more).
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// parseStatus parses the status line as http.ReadResponse does.
func parseStatus(resp *http.Response, line string) error {
	proto, status, ok := strings.Cut(line, " ")
	status = strings.TrimLeft(status, " ")
	code, _, _ := strings.Cut(status, " ")
	if !ok || len(code) != 3 || code[0] < '1' || code[0] > '9' || !digit(code[1]) || !digit(code[2]) || !validValue(status) {
		return fmt.Errorf("h1: malformed status line in the engine's answer: %q", line[:min(len(line), 80)])
	}
	major, minor, ok := http.ParseHTTPVersion(proto)
	if !ok || major != 1 {
		return fmt.Errorf("h1: the engine answered in %q, not HTTP/1.x", proto[:min(len(proto), 16)])
	}
	resp.Status, resp.Proto, resp.ProtoMajor, resp.ProtoMinor = status, proto, major, minor
	resp.StatusCode = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	return nil
}

func digit(c byte) bool { return '0' <= c && c <= '9' }

// fieldSet is what frame and pragmaNoCache read and change of a header:
// an http.Header's fields (HeaderFields) or a Head's. Names are canonical.
type fieldSet interface {
	Values(k string) []string // nil when there is none
	Del(k string)
	Set(k, v string)
}

// frame sets the answer's length, connection and trailer fields, and its
// body (made in b) read from br, by net/http's rules (its readTransfer):
// the same header fields removed (from h, resp's), the same answers
// refused.
func frame(resp *http.Response, h fieldSet, br *bufio.Reader, b *answerBody) error {
	pragmaNoCache(h)
	conn := h.Values("Connection")
	hasClose := hasToken(conn, "close")
	if resp.ProtoMinor == 0 {
		resp.Close = hasClose || !hasToken(conn, "keep-alive")
	} else {
		resp.Close = hasClose
		if hasClose {
			h.Del("Connection")
		}
	}

	chunked := false
	if te := h.Values("Transfer-Encoding"); te != nil {
		h.Del("Transfer-Encoding")
		// HTTP/1.0 has no Transfer-Encoding: ignored (net/http's issue 12785).
		if resp.ProtoMinor > 0 {
			// Only one, chunked: the surface of smuggling kept small.
			if len(te) != 1 || !asciiEqualFold(te[0], "chunked") {
				return fmt.Errorf("h1: unsupported transfer encoding %q in the engine's answer", te)
			}
			chunked = true
		}
	}

	// Copies of one Content-Length are one; different ones are refused.
	cl := h.Values("Content-Length")
	if len(cl) > 1 {
		for _, v := range cl[1:] {
			if v != cl[0] {
				return fmt.Errorf("h1: the engine's answer has different Content-Lengths %q", cl)
			}
		}
		cl = cl[:1:1]
		h.Set("Content-Length", cl[0])
	}
	n := int64(-1)
	if len(cl) > 0 {
		u, err := strconv.ParseUint(cl[0], 10, 63)
		if err != nil {
			return fmt.Errorf("h1: bad Content-Length %q in the engine's answer", cl[0])
		}
		n = int64(u)
	}

	head := resp.Request != nil && resp.Request.Method == http.MethodHead
	noBody := head || !bodyAllowed(resp.StatusCode)
	length := int64(-1) // -1: chunked, or until the connection's close
	switch {
	case noBody:
		length = 0
	case chunked:
		h.Del("Content-Length")
	case n >= 0:
		length = n
	}
	resp.ContentLength = length
	if head {
		resp.ContentLength = n
	}

	if vv := h.Values("Trailer"); vv != nil && chunked {
		h.Del("Trailer")
		t, err := declaredTrailer(vv)
		if err != nil {
			return err
		}
		resp.Trailer = t
	}

	if chunked {
		resp.TransferEncoding = []string{"chunked"}
	} else if length < 0 {
		resp.Close = true // its end is the connection's
	}
	switch {
	case chunked && !noBody:
		*b = answerBody{br: br, left: -1, chunks: httputil.NewChunkedReader(br), resp: resp}
		resp.Body = b
	case length == 0 || chunked:
		resp.Body = http.NoBody
	default:
		*b = answerBody{br: br, left: length}
		resp.Body = b
	}
	return nil
}

// bodyAllowed: 1xx, 204 and 304 answers have no body (RFC 9112 6.3).
// pragmaNoCache gives a "Pragma: no-cache" message the Cache-Control
// HTTP/1.1 reads, when it has none, as net/http does for requests and
// answers.
func pragmaNoCache(h fieldSet) {
	if p := h.Values("Pragma"); len(p) > 0 && p[0] == "no-cache" {
		if h.Values("Cache-Control") == nil {
			h.Set("Cache-Control", "no-cache")
		}
	}
}

// bodyAllowed: an answer with this status may have a body (RFC 9110).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// hasToken reports whether the comma-separated lists of values hold
// token, ASCII case aside (httpguts.HeaderValuesContainsToken).
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for elem := range strings.SplitSeq(v, ",") {
			if asciiEqualFold(trimOWS(elem), token) {
				return true
			}
		}
	}
	return false
}

// asciiEqualFold is strings.EqualFold for ASCII only: net/http folds no
// other letter in these tokens.
func asciiEqualFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		a, b := s[i], t[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// declaredTrailer is the trailer the Trailer fields announce, names with
// no values yet (net/http's fixTrailer).
func declaredTrailer(vv []string) (http.Header, error) {
	var t http.Header
	for _, v := range vv {
		for k := range strings.SplitSeq(v, ",") {
			k = trimOWS(k)
			if k == "" {
				continue
			}
			k = http.CanonicalHeaderKey(k)
			switch k {
			case "Transfer-Encoding", "Trailer", "Content-Length":
				return nil, fmt.Errorf("h1: the engine's answer declares %s as a trailer", k)
			}
			if t == nil {
				t = make(http.Header)
			}
			t[k] = nil
		}
	}
	return t, nil
}

// answerBody is an answer's body: Content-Length bytes, chunks then a
// trailer, or what comes until the connection's close.
type answerBody struct {
	br     *bufio.Reader
	left   int64          // bytes still to come with a Content-Length; -1 otherwise
	chunks io.Reader      // chunked: the chunks' reader; nil otherwise
	resp   *http.Response // chunked: where the trailer goes
	err    error          // what every read returns once the body ended or failed
}

func (b *answerBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	var n int
	var err error
	switch {
	case b.chunks != nil:
		n, err = b.chunks.Read(p)
		if err == io.EOF {
			if terr := b.readTrailer(); terr != nil {
				err = terr
			}
		}
	case b.left >= 0:
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err = b.br.Read(p)
		b.left -= int64(n)
		if b.left == 0 {
			err = io.EOF // with the last bytes, as net/http's body does
		} else if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
	default:
		n, err = b.br.Read(p)
	}
	b.err = err
	return n, err
}

// Close ends the body; reading the rest is not its business (the
// connection of an answer closed before its end is not reused).
func (b *answerBody) Close() error {
	if b.err == nil {
		b.err = http.ErrBodyReadAfterClose
	}
	return nil
}

// readTrailer reads the trailer after the last chunk into resp.Trailer,
// as net/http's body does: only a trailer whose end (CRLF CRLF) is in the
// read buffer, so that an engine's trailer cannot grow without bound.
func (b *answerBody) readTrailer() error {
	br := b.br
	if p, _ := br.Peek(2); len(p) < 2 {
		return io.ErrUnexpectedEOF
	} else if p[0] == '\r' && p[1] == '\n' {
		_, _ = br.Discard(2)
		return nil // no trailer: the common case
	}
	var window []byte
	for {
		window, _ = br.Peek(br.Buffered())
		if bytes.Contains(window, []byte("\r\n\r\n")) {
			break
		}
		if len(window) == br.Size() {
			return errTrailerTooBig
		}
		if _, err := br.Peek(len(window) + 1); err != nil {
			return unexpectedEOF(err)
		}
	}
	end := headEnd(window)
	raw := bytes.Clone(window[:end])
	_, _ = br.Discard(end)
	n, err := checkFields(raw)
	if err != nil {
		return err
	}
	t, err := buildFields(string(raw), n, nil)
	if err != nil {
		return err
	}
	if b.resp.Trailer == nil {
		b.resp.Trailer = t
		return nil
	}
	for k, vv := range t {
		b.resp.Trailer[k] = vv
	}
	return nil
}
