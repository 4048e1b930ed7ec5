package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to a running napd over its control socket.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the control socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{socket: path, http: &http.Client{Transport: tr}}
}

// Status returns the agent's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	resp, err := c.do(ctx, http.MethodGet, "/v1/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("status: %w", err)
	}
	return st, nil
}

// Wake wakes model, calling progress for each line napd sends, and returns
// nil once it is awake or an error carrying napd's reason.
func (c *Client) Wake(ctx context.Context, model string, progress func(Progress)) error {
	resp, err := c.do(ctx, http.MethodPost, "/v1/models/"+url.PathEscape(model)+"/wake")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var p Progress
		if err := dec.Decode(&p); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("wake %s: napd closed the stream before the wake finished", model)
			}
			return fmt.Errorf("wake %s: %w", model, err)
		}
		if progress != nil {
			progress(p)
		}
		if p.Done {
			if p.Error != "" {
				return errors.New(p.Error)
			}
			return nil
		}
	}
}

// Sleep puts model to sleep; strategy "" means the model's own.
func (c *Client) Sleep(ctx context.Context, model, strategy string) error {
	path := "/v1/models/" + url.PathEscape(model) + "/sleep"
	if strategy != "" {
		path += "?strategy=" + url.QueryEscape(strategy)
	}
	return c.simple(ctx, path)
}

// Reset clears a failed model.
func (c *Client) Reset(ctx context.Context, model string) error {
	return c.simple(ctx, "/v1/models/"+url.PathEscape(model)+"/reset")
}

// Logs returns the last lines of model's engine output.
func (c *Client) Logs(ctx context.Context, model string, lines int) ([]string, error) {
	resp, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/models/%s/logs?lines=%d", url.PathEscape(model), lines))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l Logs
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, fmt.Errorf("logs: %w", err)
	}
	return l.Lines, nil
}

// Usage is each key's use of each model in the whole hours since since
// ago.
func (c *Client) Usage(ctx context.Context, since time.Duration) (Usage, error) {
	var u Usage
	resp, err := c.do(ctx, http.MethodGet, "/v1/usage?since="+url.QueryEscape(since.String()))
	if err != nil {
		return u, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
		return u, fmt.Errorf("usage: %w", err)
	}
	return u, nil
}

// Reload asks napd to re-read its config file.
func (c *Client) Reload(ctx context.Context) error {
	return c.simple(ctx, "/v1/reload")
}

// Events calls fn for each event until ctx ends or the stream closes.
func (c *Client) Events(ctx context.Context, fn func(Event)) error {
	resp, err := c.do(ctx, http.MethodGet, "/v1/events")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("events: %w", err)
		}
		fn(ev)
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

func (c *Client) simple(ctx context.Context, path string) error {
	resp, err := c.do(ctx, http.MethodPost, path)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// do sends a request and turns transport failures and non-2xx replies into
// one-line errors.
func (c *Client) do(ctx context.Context, method, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://napd"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			return nil, fmt.Errorf("cannot reach napd at %s: %v (is napd running?)", c.socket, op.Err)
		}
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var e Error
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return nil, errors.New(e.Error)
	}
	return resp, nil
}
