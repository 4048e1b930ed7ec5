package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync"

	"github.com/napd/napd/engine/wire"
)

// RoundTrip sends req's body to the worker as one request, with req's
// context deadline as its deadline, and maps the reply to an HTTP response:
//
//	answer              200, the worker's content type and body
//	chunks              200, a body that streams them as they arrive (SSE)
//	refusal no room     503 with Retry-After
//	refusal invalid     400
//	refusal failed      500
//	refusal deadline    504
//
// Refusals carry the worker's text in an OpenAI error JSON. Every response
// has X-Queue-Depth when the worker reports its depth. If req's context ends
// first (the client left, or the deadline), the worker is sent a cancel and
// RoundTrip returns the context's error; if the worker dies it returns a
// *DeadError. Only the body is sent: method, path and headers are not part
// of the contract.
func (c *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("engine %s: read request body: %w", c.address, err)
		}
		body = b
	}
	cn, _ := c.current()
	if cn == nil {
		return nil, &DeadError{Address: c.address, Reason: "no session (reconnecting)", Unsent: true}
	}
	ctx := req.Context()
	id := c.nextID.Add(1)
	cl := cn.register(id)
	sub := &wire.Submit{ID: id, ContentType: req.Header.Get("Content-Type"), Body: body}
	if d, ok := ctx.Deadline(); ok {
		sub.Deadline = d.UnixNano()
	}
	if err := cn.send(sub); err != nil {
		cn.forget(id)
		if errors.Is(err, errSessionDead) {
			// The session died between current() and send: the
			// request never went out, so it may be held or rerouted.
			return nil, &DeadError{Address: c.address, Reason: cn.deadErr.Reason, Unsent: true}
		}
		cn.die("send: " + err.Error())
		return nil, cn.deadErr
	}
	m, err := cl.next(ctx)
	if err != nil {
		cn.forget(id)
		if !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		// The budget ran out before the worker's own Deadline refusal
		// arrived: answer what it would have.
		m = &wire.Refusal{ID: id, Kind: wire.KindDeadline, Message: "the worker did not answer within the deadline"}
	}
	resp := &http.Response{
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header),
		Request:    req,
	}
	if depth, ok := cn.queueDepth(); ok {
		resp.Header.Set("X-Queue-Depth", strconv.FormatUint(depth, 10))
	}
	switch m := m.(type) {
	case *wire.Answer:
		setOK(resp, m.ContentType)
		resp.Body = io.NopCloser(bytes.NewReader(m.Body))
		resp.ContentLength = int64(len(m.Body))
	case *wire.Chunk:
		setOK(resp, m.ContentType)
		resp.Body = &stream{ctx: ctx, cl: cl, pending: m.Data}
		resp.ContentLength = -1
	case *wire.Refusal:
		c.refusal(resp, m)
	}
	return resp, nil
}

func setOK(resp *http.Response, contentType string) {
	resp.StatusCode = http.StatusOK
	resp.Status = "200 OK"
	if contentType != "" {
		resp.Header.Set("Content-Type", contentType)
	}
}

// refusal fills resp for a refused request.
func (c *Client) refusal(resp *http.Response, r *wire.Refusal) {
	status, typ, code := refusalStatus(r.Kind)
	if status == http.StatusServiceUnavailable {
		resp.Header.Set("Retry-After", strconv.Itoa(int(math.Ceil(c.opts.RetryAfter.Seconds()))))
	}
	body := ErrorJSON(r.Message, typ, code)
	resp.StatusCode = status
	resp.Status = fmt.Sprintf("%d %s", status, http.StatusText(status))
	resp.Header.Set("Content-Type", "application/json")
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
}

// refusalStatus maps a refusal kind to its HTTP status and OpenAI error
// type and code.
func refusalStatus(kind uint8) (status int, typ, code string) {
	switch kind {
	case wire.KindNoRoom:
		return http.StatusServiceUnavailable, "server_error", "no_room"
	case wire.KindInvalidRequest:
		return http.StatusBadRequest, "invalid_request_error", "invalid_request"
	case wire.KindDeadline:
		return http.StatusGatewayTimeout, "timeout_error", "deadline_exceeded"
	}
	return http.StatusInternalServerError, "server_error", "inference_failed"
}

// ErrorJSON renders an OpenAI-shaped error body:
// {"error":{"message":…,"type":…,"code":…}}.
func ErrorJSON(message, typ, code string) []byte {
	type detail struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	}
	b, _ := json.Marshal(struct {
		Error detail `json:"error"`
	}{detail{message, typ, code}}) // cannot fail: strings only
	return append(b, '\n')
}

// StreamError ends a streamed body whose worker refused mid-stream: the
// status (200) is already sent, so the stream is cut short visibly.
type StreamError struct {
	Kind    uint8 // wire.Kind*
	Message string
}

func (e *StreamError) Error() string {
	_, _, code := refusalStatus(e.Kind)
	return fmt.Sprintf("engine stream refused (%s): %s", code, e.Message)
}

// stream is the body of a streamed answer.
type stream struct {
	ctx     context.Context
	cl      *call
	pending []byte
	err     error // set when the stream has ended (io.EOF on success)
	once    sync.Once
}

func (s *stream) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		m, err := s.cl.next(s.ctx)
		if err != nil {
			s.err = err
			s.close()
			return 0, err
		}
		switch m := m.(type) {
		case *wire.Chunk:
			s.pending = m.Data
		case *wire.Answer:
			s.pending, s.err = m.Body, io.EOF
		case *wire.Refusal:
			s.err = &StreamError{Kind: m.Kind, Message: m.Message}
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// Close cancels the request on the worker when the stream has not ended.
func (s *stream) Close() error {
	s.close()
	return nil
}

func (s *stream) close() { s.once.Do(func() { s.cl.cn.forget(s.cl.id) }) }
