package fleet

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// ambiguousRequests sends requests whose framing two HTTP parsers might
// read differently (request smuggling) through HAProxy to napd on h,
// where qwen is awake. Each carries a request hidden in its body, tagged
// by its case; whatever HAProxy forwards, napd must read exactly the
// requests HAProxy read: every request napd logged for a case is one
// HAProxy logged, so no request HAProxy took for body bytes reaches an
// engine through napd. Either may refuse a request instead.
func (f *fleet) ambiguousRequests(t *testing.T, h *host) {
	hidden := func(tag string) string {
		return "GET /upstream/qwen/hidden-" + tag + " HTTP/1.1\r\nHost: x\r\n\r\n"
	}
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	head := func(tag, fields string) string {
		return "POST /upstream/qwen/probe-" + tag + " HTTP/1.1\r\nHost: x\r\n" + fields + "\r\n"
	}
	canary := func(tag string) string {
		return "GET /upstream/qwen/canary-" + tag + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
	}
	cases := map[string]string{
		// A Content-Length reader takes the hidden request as body; a
		// Transfer-Encoding reader as the next request.
		"cl-te": head("cl-te", fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n", len("0\r\n\r\n"+hidden("cl-te")))) +
			"0\r\n\r\n" + hidden("cl-te"),
		// The other way round.
		"te-cl": head("te-cl", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n") +
			chunk(hidden("te-cl")) + "0\r\n\r\n" + canary("te-cl"),
		"two-lengths": head("two-lengths", fmt.Sprintf("Content-Length: 0\r\nContent-Length: %d\r\n", len(hidden("two-lengths")))) +
			hidden("two-lengths") + canary("two-lengths"),
		"te-space": head("te-space", fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding : chunked\r\n", len("0\r\n\r\n"+hidden("te-space")))) +
			"0\r\n\r\n" + hidden("te-space"),
		"te-folded": head("te-folded", fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding:\r\n chunked\r\n", len("0\r\n\r\n"+hidden("te-folded")))) +
			"0\r\n\r\n" + hidden("te-folded"),
		"te-other": head("te-other", fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding: xchunked\r\n", len("0\r\n\r\n"+hidden("te-other")))) +
			"0\r\n\r\n" + hidden("te-other"),
		"bare-lf": strings.ReplaceAll(head("bare-lf", fmt.Sprintf("Content-Length: %d\r\n", len(hidden("bare-lf")))), "\r\n", "\n") +
			hidden("bare-lf") + canary("bare-lf"),
		"huge-chunk": head("huge-chunk", "Transfer-Encoding: chunked\r\n") + "fffffffffffffffffff\r\n" + hidden("huge-chunk") + "\r\n0\r\n\r\n",
		"pipelined":  head("pipelined", "Content-Length: 0\r\n") + head("pipelined", "Content-Length: 0\r\n") + canary("pipelined"),
		"http10":     "POST /upstream/qwen/probe-http10 HTTP/1.0\r\nContent-Length: 0\r\n\r\n" + canary("http10"),
	}
	for tag, request := range cases {
		answers := rawExchange(t, f.front, request)
		t.Logf("%s: answers %v", tag, answers)
	}
	// Expect: 100-continue beyond max_body: refused before the body.
	if got := expectTooLarge(t, f.front); got != 413 {
		t.Errorf("Expect: 100-continue beyond max_body: %d, want 413 before the body", got)
	}

	// HAProxy logs a request when it ends, napd too: both logs settle.
	tagged := regexp.MustCompile(`/upstream/qwen/(probe|hidden|canary)-[a-z0-9-]+`)
	var ours, theirs []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		b, err := os.ReadFile(f.log)
		if err != nil {
			t.Fatal(err)
		}
		ours, theirs = tagged.FindAllString(h.napd.Log(), -1), tagged.FindAllString(string(b), -1)
		if len(ours) > 0 && len(ours) <= len(theirs) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling two logs written by other processes
	}
	slices.Sort(ours)
	slices.Sort(theirs)
	t.Logf("napd read %q\nHAProxy read %q", ours, theirs)
	if len(ours) == 0 {
		t.Fatal("napd logged none of the requests HAProxy forwarded")
	}
	// Every request napd read is one HAProxy read, as often.
	rest := slices.Clone(theirs)
	for _, p := range ours {
		i := slices.Index(rest, p)
		if i < 0 {
			t.Errorf("napd read a request HAProxy did not forward as one: %s", p)
			continue
		}
		rest = slices.Delete(rest, i, i+1)
	}
}

// rawExchange writes request on a connection of its own to addr and reads
// the answers until the connection ends or goes quiet, as their statuses.
func rawExchange(t *testing.T, addr, request string) []int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var got []int
	for {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return got
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got = append(got, resp.StatusCode)
		if resp.Close {
			return got
		}
	}
}

// expectTooLarge announces a body beyond napd's max_body (16 MiB) with
// Expect: 100-continue and returns the status of the final answer.
// HAProxy (option http-buffer-request) answers 100 Continue itself and
// waits for a buffer of body (256 KiB) before it forwards the request:
// napd refuses it then, long before the announced 64 MiB are sent.
func expectTooLarge(t *testing.T, addr string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", 64<<20)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	for sent := false; ; {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer to an announced body beyond max_body: %v", err)
		}
		if resp.StatusCode != http.StatusContinue {
			return resp.StatusCode
		}
		if !sent {
			sent = true
			_, _ = c.Write([]byte(`{"model":"qwen","pad":"` + strings.Repeat("x", 300<<10)))
		}
	}
}
