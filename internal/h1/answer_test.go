package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// answerCases are answers read both by readAnswer and http.ReadResponse;
// refused: readAnswer refuses it (whether net/http does or not).
var answerCases = []struct {
	name, answer, method string
	refused              bool
}{
	{"length", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello", "POST", false},
	{"engine's lower case names", "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\ncontent-type: application/json\r\nx-request-id: abc\r\n\r\nok", "POST", false},
	{"non-canonical names", "HTTP/1.1 200 OK\r\nCONTENT-TYPE: a\r\ncontent-LENGTH: 2\r\nx-ReQuEsT-iD: 1\r\nwww-authenticate: x\r\n\r\nok", "GET", false},
	{"several values of one name", "HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nVary: Accept\r\nset-cookie: b=2\r\nVary: Origin, Accept-Encoding\r\nContent-Length: 0\r\n\r\n", "GET", false},
	{"values trimmed", "HTTP/1.1 200 OK\r\nX-A:\t  spaced \t\r\nX-B:\r\nX-C:  \r\nContent-Length:  3 \r\n\r\nabc", "GET", false},
	{"obs-text value", "HTTP/1.1 200 OK\r\nX-A: caf\xc3\xa9 \x80\xff\r\nContent-Length: 0\r\n\r\n", "GET", false},
	{"bare LF line ends", "HTTP/1.1 200 OK\nContent-Length: 2\nX-A: 1\n\nok", "GET", false},
	{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n", "POST", false},
	{"chunked, upper case", "HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n3\r\nhel\r\n0\r\n\r\n", "POST", false},
	{"chunked with a trailer", "HTTP/1.1 200 OK\r\nTrailer: X-Sum, x-other\r\nTrailer: X-Third\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n0\r\nX-Sum: 1\r\nx-other: 2\r\nX-Undeclared: 3\r\n\r\nnext", "POST", false},
	{"trailer declared, none sent", "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "POST", false},
	{"trailer declared, not chunked", "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nContent-Length: 1\r\n\r\nx", "POST", false},
	{"trailer with bare LF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Sum: 1\n\n", "POST", true},
	{"trailer folded", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Sum: 1\r\n 2\r\n\r\n", "POST", true},
	{"trailer over the buffer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Sum: " + strings.Repeat("a", 5000) + "\r\n\r\n", "POST", true},
	{"trailer cut", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Sum: 1\r\n", "POST", true},
	{"chunked cut", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhe", "POST", true},
	{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhel\r\n0\r\n\r\n", "POST", true},
	{"trailer declares Content-Length", "HTTP/1.1 200 OK\r\nTrailer: Content-Length\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "POST", true},
	{"chunked and a length", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", "POST", false},
	{"gzip encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx", "POST", true},
	{"two encodings", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "POST", true},
	{"two encoding fields", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "POST", true},
	{"empty encoding", "HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n", "POST", true},
	{"until close", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end", "POST", false},
	{"HTTP/1.0 until close", "HTTP/1.0 200 OK\r\n\r\nto the end", "GET", false},
	{"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"HTTP/1.0 chunked is ignored", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", "GET", false},
	{"HTTP/1.2", "HTTP/1.2 200 OK\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"Connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"Connection: keep-alive, Close", "HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"Connection: closed", "HTTP/1.1 200 OK\r\nConnection: closed\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"Connection, non-ASCII fold", "HTTP/1.1 200 OK\r\nConnection: clo\xc5\xbfe\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"100 Continue, then the answer", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "POST", false},
	{"103 with a length", "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\nLink: </b>\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", "GET", false},
	{"101", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\nraw", "GET", false},
	{"HEAD with a length", "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", "HEAD", false},
	{"HEAD chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 7\r\n\r\n", "HEAD", false},
	{"HEAD without length", "HTTP/1.1 200 OK\r\n\r\n", "HEAD", false},
	{"204 with a length", "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", "POST", false},
	{"204 chunked", "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\nTrailer: X-A\r\n\r\n", "POST", false},
	{"304", "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nEtag: \"x\"\r\n\r\n", "GET", false},
	{"304 with a bad length", "HTTP/1.1 304 Not Modified\r\nContent-Length: x\r\n\r\n", "GET", true},
	{"Pragma: no-cache", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n", "GET", false},
	{"length zero", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nnext", "GET", false},
	{"length short", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", "GET", true},
	{"same length twice", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length:  2\r\n\r\nok", "GET", false},
	{"different lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!", "GET", true},
	{"two lengths in one", "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", "GET", true},
	{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "GET", true},
	{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "GET", true},
	{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", "GET", true},
	{"empty length", "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", "GET", true},
	{"huge length", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "GET", true},
	{"obs-fold", "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"obs-fold of spaces", "HTTP/1.1 200 OK\r\nX-A: a\r\n  \r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"first field folded", "HTTP/1.1 200 OK\r\n X-A: a\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"missing colon", "HTTP/1.1 200 OK\r\nX-A a\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"space before colon", "HTTP/1.1 200 OK\r\nX-A : a\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"empty name", "HTTP/1.1 200 OK\r\n: a\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"bad name", "HTTP/1.1 200 OK\r\nX(A): a\r\n\r\n", "GET", true},
	{"control in value", "HTTP/1.1 200 OK\r\nX-A: a\x01b\r\n\r\n", "GET", true},
	{"DEL in value", "HTTP/1.1 200 OK\r\nX-A: a\x7f\r\n\r\n", "GET", true},
	{"CR in value", "HTTP/1.1 200 OK\r\nX-A: a\rb\r\n\r\n", "GET", true},
	{"CR CR LF", "HTTP/1.1 200 OK\r\nX-A: a\r\r\n\r\n", "GET", true},
	{"no reason phrase", "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"empty reason phrase", "HTTP/1.1 404 \r\nContent-Length: 2\r\n\r\nno", "GET", false},
	{"spaces before the code", "HTTP/1.1   200 OK\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"unknown status", "HTTP/1.1 599 Whatever it is\r\nContent-Length: 2\r\n\r\nok", "GET", false},
	{"huge status code", "HTTP/1.1 2000 OK\r\n\r\n", "GET", true},
	{"short status code", "HTTP/1.1 20 OK\r\n\r\n", "GET", true},
	{"status code under 100", "HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"signed status code", "HTTP/1.1 +20 OK\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"control in the reason", "HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"tab after the code", "HTTP/1.1 200\tOK\r\n\r\n", "GET", true},
	{"no status", "HTTP/1.1\r\n\r\n", "GET", true},
	{"HTTP/2.0", "HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"HTTP/0.9", "HTTP/0.9 200 OK\r\nContent-Length: 0\r\n\r\n", "GET", true},
	{"bad version", "HTTX/1.1 200 OK\r\n\r\n", "GET", true},
	{"empty first line", "\r\nHTTP/1.1 200 OK\r\n\r\n", "GET", true},
	{"nothing", "", "GET", true},
	{"cut in the status line", "HTTP/1.1 200", "GET", true},
	{"cut in the head", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", "GET", true},
	{"garbage", "hello world, this is not HTTP\r\n\r\n", "GET", true},
	{"head over the buffer", "HTTP/1.1 200 OK\r\n" + strings.Repeat("x-pad: "+strings.Repeat("a", 100)+"\r\n", 80) + "Content-Length: 2\r\n\r\nok", "GET", false},
	{"many fields", "HTTP/1.1 200 OK\r\n" + strings.Repeat("a: b\r\n", 1200) + "Content-Length: 2\r\n\r\nok", "GET", false},
}

// readAnswer reads every answer as http.ReadResponse does, or refuses it.
func TestReadAnswerAsNetHTTP(t *testing.T) {
	for _, c := range answerCases {
		t.Run(c.name, func(t *testing.T) {
			refused := compareAnswers(t, []byte(c.answer), &http.Request{Method: c.method})
			if refused != c.refused {
				t.Errorf("refused %v, want %v", refused, c.refused)
			}
		})
	}
}

// A few readings spelled out, not only compared with net/http's.
func TestReadAnswerFields(t *testing.T) {
	read := func(answer, method string) (*http.Response, string) {
		t.Helper()
		resp, err := readResponse(bufio.NewReader(strings.NewReader(answer)), &http.Request{Method: method})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}
	resp, body := read("HTTP/1.1 201 Created\r\ncontent-type: a\r\nX-Multi: 1\r\nx-multi: 2\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabcdef", "POST")
	want := http.Header{"Content-Type": {"a"}, "X-Multi": {"1", "2"}, "Content-Length": {"3"}}
	if resp.Status != "201 Created" || resp.StatusCode != 201 || resp.Proto != "HTTP/1.1" || resp.ProtoMinor != 1 ||
		!reflect.DeepEqual(resp.Header, want) || resp.ContentLength != 3 || !resp.Close || body != "abc" {
		t.Errorf("%+v %q", resp, body)
	}
	resp, body = read("HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 7\r\n\r\n", "POST")
	if body != "ok" || resp.ContentLength != -1 || !reflect.DeepEqual(resp.TransferEncoding, []string{"chunked"}) ||
		!reflect.DeepEqual(resp.Trailer, http.Header{"X-Sum": {"7"}}) || resp.Close {
		t.Errorf("%+v %q trailer %v", resp, body, resp.Trailer)
	}
	resp, body = read("HTTP/1.0 200 OK\r\n\r\nall", "GET")
	if body != "all" || resp.ContentLength != -1 || !resp.Close || resp.ProtoMinor != 0 {
		t.Errorf("%+v %q", resp, body)
	}
}

// readResponse is readAnswer with http.ReadResponse's signature.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	a, err := readAnswer(br, req, false)
	if err != nil {
		return nil, err
	}
	return &a.resp, nil
}

// readHeadResponse is readResponse with the fields read as a Head.
func readHeadResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	a, err := readAnswer(br, req, true)
	if err != nil {
		return nil, err
	}
	return &a.resp, nil
}

// sameAsHead reads data as a Head and fails t unless that reading is the
// http.Header one's (got, gerr): the same refusal, or the same fields,
// in a Head whose Header is got's, and the same framing.
func sameAsHead(t *testing.T, data []byte, req *http.Request, got *http.Response, gerr error) {
	t.Helper()
	a, err := readAnswer(bufio.NewReaderSize(bytes.NewReader(data), 4096), req, true)
	if (err != nil) != (gerr != nil) {
		t.Fatalf("%q: read as a Head: %v; as a header: %v", data, err, gerr)
	}
	if err != nil {
		return
	}
	h := a.head.Header()
	if len(got.Header) == 0 && len(h) == 0 {
		h = got.Header // empty alike
	}
	if r := &a.resp; r.Header != nil || !reflect.DeepEqual(h, got.Header) || a.head.Len() != fieldCount(got.Header) ||
		r.ContentLength != got.ContentLength || r.Close != got.Close || r.StatusCode != got.StatusCode ||
		!reflect.DeepEqual(r.TransferEncoding, got.TransferEncoding) || !reflect.DeepEqual(r.Trailer, got.Trailer) {
		t.Fatalf("%q: read as a Head %+v, fields %v; as a header %+v", data, r, h, got)
	}
}

func fieldCount(h http.Header) int {
	n := 0
	for _, vv := range h {
		n += len(vv)
	}
	return n
}

// compareAnswers reads data with readAnswer and http.ReadResponse and
// fails t where they differ: readAnswer refuses all net/http refuses, and
// otherwise reads the same answer, or refuses it for a reason it has and
// net/http has not. It reports whether readAnswer refused the answer.
func compareAnswers(t *testing.T, data []byte, req *http.Request) (refused bool) {
	t.Helper()
	wbr, gbr := bufio.NewReaderSize(bytes.NewReader(data), 4096), bufio.NewReaderSize(bytes.NewReader(data), 4096)
	want, werr := http.ReadResponse(wbr, req)
	got, gerr := readResponse(gbr, req)
	sameAsHead(t, data, req, got, gerr)
	if werr != nil {
		if gerr == nil {
			t.Fatalf("readAnswer read %q, which net/http refuses (%v)", data, werr)
		}
		return true
	}
	if gerr != nil {
		if !stricter(data, want) {
			t.Fatalf("readAnswer refuses %q (%v), which net/http reads", data, gerr)
		}
		return true
	}
	if got.Status != want.Status || got.StatusCode != want.StatusCode || got.Proto != want.Proto ||
		got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor ||
		got.ContentLength != want.ContentLength || got.Close != want.Close || got.Uncompressed ||
		got.Request != req || !reflect.DeepEqual(got.TransferEncoding, want.TransferEncoding) {
		t.Fatalf("%q:\nread      %+v\nnet/http: %+v", data, got, want)
	}
	if !reflect.DeepEqual(got.Header, want.Header) || !reflect.DeepEqual(got.Trailer, want.Trailer) {
		t.Fatalf("%q:\nheader %v, trailer %v\nnet/http: %v, %v", data, got.Header, got.Trailer, want.Header, want.Trailer)
	}
	if (got.Body == http.NoBody) != (want.Body == http.NoBody) {
		t.Fatalf("%q: body %T, net/http's %T", data, got.Body, want.Body)
	}
	wb, werr := io.ReadAll(want.Body)
	gb, gerr := io.ReadAll(got.Body)
	if werr != nil {
		if gerr == nil {
			t.Fatalf("%q: read the body %q whole, net/http fails (%v)", data, gb, werr)
		}
		return true
	}
	if gerr != nil {
		if !errors.Is(gerr, errFolded) && !badNames(want.Trailer) {
			t.Fatalf("%q: the body fails (%v) where net/http reads %q", data, gerr, wb)
		}
		return true
	}
	if !bytes.Equal(gb, wb) || !reflect.DeepEqual(got.Trailer, want.Trailer) {
		t.Fatalf("%q: body %q trailer %v, net/http's %q %v", data, gb, got.Trailer, wb, want.Trailer)
	}
	// What follows the answer is where the next one starts.
	wrest, _ := io.ReadAll(wbr)
	grest, _ := io.ReadAll(gbr)
	if !bytes.Equal(grest, wrest) {
		t.Fatalf("%q: %q left after the answer, net/http leaves %q", data, grest, wrest)
	}
	if err := got.Body.Close(); err != nil {
		t.Fatal(err)
	}
	return false
}

// stricter reports whether readAnswer may refuse an answer net/http read
// as want: a folded line in its head, a space in a name, a status code not
// of three digits from 100, a version other than HTTP/1.x, a control
// character in its reason phrase.
func stricter(data []byte, want *http.Response) bool {
	code := want.Status[:3] // net/http checked there are three bytes
	if want.ProtoMajor != 1 || code < "100" || code > "999" || strings.IndexByte(code, '+') >= 0 ||
		!validValue(want.Status) || badNames(want.Header) {
		return true
	}
	// Past the status line, a line starting with a space or tab before the
	// empty one.
	for _, line := range strings.Split(string(data), "\n")[1:] {
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			return false
		}
		if line[0] == ' ' || line[0] == '\t' {
			return true
		}
	}
	return false
}

func badNames(h http.Header) bool {
	for k := range h {
		if !validName(k) {
			return true
		}
	}
	return false
}

// FuzzReadAnswer: whatever the engine sends, readAnswer refuses all that
// net/http's reader refuses, and reads the rest as it does, or refuses it
// for one of its stricter rules.
func FuzzReadAnswer(f *testing.F) {
	for _, c := range answerCases {
		f.Add([]byte(c.answer), uint8(len(c.method)))
	}
	f.Fuzz(func(t *testing.T, data []byte, method uint8) {
		req := []*http.Request{{Method: "GET"}, {Method: "HEAD"}, {Method: "POST"}, nil}[method%4]
		compareAnswers(t, data, req)
	})
}

// engineAnswers are typical answer heads of an engine (uvicorn's lower
// case names): a JSON answer with a length, and a stream.
var engineAnswers = []struct{ name, answer string }{
	{"json", "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 64\r\ncontent-type: application/json\r\nx-request-id: chatcmpl-7f3a9c2e4b1d4e0f\r\n\r\n" + strings.Repeat("x", 64)},
	{"stream", "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n13\r\ndata: {\"token\":1}\n\n\r\n0\r\n\r\n"},
}

func BenchmarkReadAnswer(b *testing.B) {
	readers := []struct {
		name string
		read func(*bufio.Reader, *http.Request) (*http.Response, error)
	}{{"h1", readResponse}, {"h1-head", readHeadResponse}, {"net-http", http.ReadResponse}}
	req := &http.Request{Method: http.MethodPost}
	for _, a := range engineAnswers {
		for _, r := range readers {
			b.Run(a.name+"/"+r.name, func(b *testing.B) {
				src := strings.NewReader(a.answer)
				br := bufio.NewReaderSize(src, 4<<10)
				buf := make([]byte, 256)
				b.ReportAllocs()
				for b.Loop() {
					src.Reset(a.answer)
					br.Reset(src)
					resp, err := r.read(br, req)
					if err != nil {
						b.Fatal(err)
					}
					for err == nil {
						_, err = resp.Body.Read(buf)
					}
					if err != io.EOF {
						b.Fatal(err)
					}
					resp.Body.Close()
				}
			})
		}
	}
}

// Through the transport: the trailer is there once the body was read to
// its end (ReverseProxy copies it then), and an answer refused fails its
// request and closes its connection.
func TestTransportAnswers(t *testing.T) {
	url, conns := rawServer(t, func(_ int, r *http.Request) (string, bool) {
		switch r.URL.Path {
		case "/trailer":
			return "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 7\r\n\r\n", false
		case "/lengths":
			return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!", false
		case "/folded":
			return "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	tr := &Transport{}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(post(t, context.Background(), url+"/trailer", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(resp.Trailer, http.Header{"X-Sum": nil}) {
		t.Errorf("trailer before the body: %v, want the declared names", resp.Trailer)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(b) != "ok" || !reflect.DeepEqual(resp.Trailer, http.Header{"X-Sum": {"7"}}) {
		t.Fatalf("%q %v, trailer %v", b, err, resp.Trailer)
	}
	for _, path := range []string{"/lengths", "/folded"} {
		if resp, err := tr.RoundTrip(post(t, context.Background(), url+path, "{}")); err == nil {
			resp.Body.Close()
			t.Errorf("%s: answer taken, want an error", path)
		}
	}
	if status, body := roundTrip(t, tr, post(t, context.Background(), url, "{}")); status != 200 || body != "ok" {
		t.Fatalf("%d %q", status, body)
	}
	// The trailer's request and the first refused one share a connection;
	// a refused answer closes its connection: three in all.
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3", n)
	}
}
