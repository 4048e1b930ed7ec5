package supervisor

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxControlAnswer bounds how much of a control endpoint's answer is read.
const maxControlAnswer = 64 << 10

// controlCall is one POST to an engine's control endpoint; body is JSON or
// empty.
type controlCall struct {
	path string // with query
	body string
}

// post sends c and requires a 2xx answer.
func (t target) post(ctx context.Context, c controlCall) error {
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.spec.BaseURL()+c.path, body)
	if err != nil {
		return fmt.Errorf("POST %s: %w", c.path, err)
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	_, err = t.do(req)
	return err
}

// get fetches path and returns the answer of a 2xx.
func (t target) get(ctx context.Context, path string) ([]byte, error) {
	return t.getBounded(ctx, path, maxControlAnswer)
}

// getBounded is get reading at most limit bytes of the answer.
func (t target) getBounded(ctx context.Context, path string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.spec.BaseURL()+path, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	return t.doBounded(req, limit)
}

// do runs req. Errors name the method, path and status, never the answer's
// body.
func (t target) do(req *http.Request) ([]byte, error) { return t.doBounded(req, maxControlAnswer) }

func (t target) doBounded(req *http.Request, limit int64) ([]byte, error) {
	what := req.Method + " " + req.URL.RequestURI()
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("%s: %s", what, resp.Status)
	}
	return b, nil
}
