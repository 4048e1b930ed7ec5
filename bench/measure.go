package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// small is the non-streamed request of the proxy-cost figures.
func small(model string) string {
	return `{"model":` + strconv.Quote(model) + `,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
}

// client is an HTTP client that keeps enough idle connections for every
// concurrent worker, so no figure includes connection set-up.
func client() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        8192,
		MaxIdleConnsPerHost: 8192,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// post sends body to url and reads the whole reply.
func post(ctx context.Context, c *http.Client, url, body string) error {
	return postAs(ctx, c, url, body, "")
}

// postAs is post with key's bearer token ("" = none).
func postAs(ctx context.Context, c *http.Client, url, body, key string) error {
	resp, err := send(ctx, c, url, body, key)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return nil
}

// send posts a JSON body to url, with key's bearer token ("" = none).
func send(ctx context.Context, c *http.Client, url, body, key string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return c.Do(req)
}

// percentile is the p-th percentile (0..1) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

// latency holds the sequential round-trip figures of one path.
type latency struct {
	median, p99 time.Duration
}

func summarize(ds []time.Duration) latency {
	slices.Sort(ds)
	return latency{median: percentile(ds, 0.5), p99: percentile(ds, 0.99)}
}

// measureLatency sends n small requests one at a time on each path,
// alternating, so drift and noise from the shared machine hit both alike.
func measureLatency(ctx context.Context, direct, viaNapd, body string, n int) (d, v latency, err error) {
	cd, cv := client(), client()
	for i := range 200 { // warm-up: connections, the engine's and napd's caches
		if err := post(ctx, cd, direct, body); err != nil {
			return d, v, err
		}
		if err := post(ctx, cv, viaNapd, body); err != nil {
			return d, v, fmt.Errorf("warm-up %d: %w", i, err)
		}
	}
	dd, vv := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if err := post(ctx, cd, direct, body); err != nil {
			return d, v, err
		}
		dd = append(dd, time.Since(t))
		t = time.Now()
		if err := post(ctx, cv, viaNapd, body); err != nil {
			return d, v, err
		}
		vv = append(vv, time.Since(t))
	}
	return summarize(dd), summarize(vv), nil
}

// measureThroughput runs workers concurrent request loops against url
// for dur and returns completed requests per second.
func measureThroughput(ctx context.Context, url, body string, workers int, dur time.Duration) (float64, error) {
	c := client()
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := post(ctx, c, url, body); err != nil {
					if ctx.Err() == nil {
						once.Do(func() { firstErr = err; cancel() })
					}
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

// chunkDelays opens streams one after another and returns, for every SSE
// chunk, the time from the engine's write (the chunk's "t" stamp) to the
// client's read of it.
func chunkDelays(ctx context.Context, url string, streams, chunks int, interval time.Duration) ([]time.Duration, error) {
	c := client()
	body := fmt.Sprintf(`{"model":"proxy","stream":true,"max_tokens":%d,"bench_interval_ms":%d,"messages":[{"role":"user","content":"hello"}]}`,
		chunks, interval.Milliseconds())
	var out []time.Duration
	for range streams {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("stream: status %d", resp.StatusCode)
		}
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadSlice('\n')
			now := time.Now().UnixNano()
			if err != nil {
				resp.Body.Close()
				if err == io.EOF {
					break
				}
				return nil, err
			}
			if t, ok := stamp(line); ok {
				out = append(out, time.Duration(now-t))
			}
		}
	}
	return out, nil
}

var stampKey = []byte(`"t":`)

// stamp finds the engine's send time in an SSE data line.
func stamp(line []byte) (int64, bool) {
	i := bytes.Index(line, stampKey)
	if i < 0 {
		return 0, false
	}
	rest := line[i+len(stampKey):]
	j := bytes.IndexByte(rest, ',')
	if j < 0 {
		return 0, false
	}
	t, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return t, err == nil
}

// openStreams holds k streams open through url (one chunk every
// interval), waits until each has delivered its first chunk, and then
// calls sample while they are all open. It returns how many opened.
func openStreams(ctx context.Context, url string, k int, interval time.Duration, sample func()) (int, error) {
	c := client()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	body := fmt.Sprintf(`{"model":"proxy","stream":true,"max_tokens":100000,"bench_interval_ms":%d,"messages":[{"role":"user","content":"hello"}]}`,
		interval.Milliseconds())
	var opened atomic.Int64
	var failed atomic.Int64
	var mu sync.Mutex
	var firstErr error // why the first stream failed
	fail := func(err error) {
		failed.Add(1)
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i := range k {
		if i%100 == 0 {
			time.Sleep(20 * time.Millisecond) // ramp up in batches: no SYN flood
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			resp, err := c.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					fail(err)
				}
				return
			}
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			if _, err := r.ReadSlice('\n'); err != nil {
				fail(fmt.Errorf("status %d: %w", resp.StatusCode, err))
				return
			}
			if resp.StatusCode != http.StatusOK {
				fail(fmt.Errorf("status %d", resp.StatusCode))
				return
			}
			opened.Add(1)
			_, _ = io.Copy(io.Discard, r)
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for opened.Load()+failed.Load() < int64(k) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if f := failed.Load(); f > 0 {
		mu.Lock()
		fmt.Fprintf(os.Stderr, "bench: %d of %d streams failed to open; the first: %v\n", f, k, firstErr)
		mu.Unlock()
	}
	if opened.Load() > 0 {
		sample()
	}
	n := int(opened.Load())
	cancel()
	wg.Wait()
	return n, nil
}

// wakeFigure is one wake: when the engine turned healthy and when the
// waiting request got its reply, both relative to the request's start.
type wakeFigure struct {
	delay   time.Duration // the engine's start-up delay
	healthy time.Duration // request start → engine healthy
	replied time.Duration // request start → reply read
}

// measureWake sends one request to a sleeping wake model and times it
// against the moment its engine turned healthy (written by the engine).
func measureWake(ctx context.Context, n *napd, d time.Duration) (wakeFigure, error) {
	model := wakeModel(d)
	os.Remove(n.readyFile(d))
	start := time.Now()
	if err := post(ctx, client(), "http://"+n.addr+"/v1/chat/completions", small(model)); err != nil {
		return wakeFigure{}, err
	}
	replied := time.Since(start)
	b, err := os.ReadFile(n.readyFile(d))
	if err != nil {
		return wakeFigure{}, fmt.Errorf("wake %s: %w", model, err)
	}
	ready, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return wakeFigure{}, fmt.Errorf("wake %s: ready file: %w", model, err)
	}
	f := wakeFigure{delay: d, healthy: time.Duration(ready - start.UnixNano()), replied: replied}
	if err := n.sleepModel(ctx, model); err != nil {
		return f, fmt.Errorf("sleep %s: %w", model, err)
	}
	return f, nil
}

// streamCPU is napd's CPU time per stream of chunks chunks (interval
// apart), from napd's CPU clock over streams streams, parallel at a time.
func streamCPU(ctx context.Context, n *napd, url string, streams, parallel, chunks int, interval time.Duration) (time.Duration, error) {
	c := client()
	body := fmt.Sprintf(`{"model":"proxy","stream":true,"max_tokens":%d,"bench_interval_ms":%d,"messages":[{"role":"user","content":"hello"}]}`,
		chunks, interval.Milliseconds())
	jobs := make(chan struct{}, streams)
	for range streams {
		jobs <- struct{}{}
	}
	close(jobs)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	cpu0 := n.cpu()
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				if err := post(ctx, c, url, body); err != nil {
					failed.Store(&err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, *err
	}
	return (n.cpu() - cpu0) / time.Duration(streams), nil
}
