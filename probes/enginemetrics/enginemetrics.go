// Package enginemetrics scrapes an engine's Prometheus /metrics for the
// evidence the planner needs: how many requests the engine itself is
// running and queueing (vLLM, SGLang), and vLLM's own sleep state.
package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metric names engines publish. vLLM and SGLang report per-engine series
// with labels (model_name, engine, tp_rank); the counts are summed.
const (
	VLLMRunning    = "vllm:num_requests_running"
	VLLMWaiting    = "vllm:num_requests_waiting"
	VLLMSleepState = "vllm:engine_sleep_state"
	SGLangRunning  = "sglang:num_running_reqs"
	SGLangWaiting  = "sglang:num_queue_reqs"
)

// Evidence is what an engine says about its own work. The zero value is
// "no evidence": the engine publishes neither vLLM's nor SGLang's counts,
// or could not be scraped.
type Evidence struct {
	// Engine is "vllm" or "sglang"; "" means no evidence.
	Engine  string
	Running int
	Waiting int
	// SleepState is vLLM's engine_sleep_state ("awake", "weights_offloaded",
	// "discard_all"), "" when not published.
	SleepState string
}

// Have reports whether the engine gave evidence.
func (e Evidence) Have() bool { return e.Engine != "" }

// Idle reports evidence of no running and no waiting request.
func (e Evidence) Idle() bool { return e.Have() && e.Running == 0 && e.Waiting == 0 }

// maxBody bounds a scrape; a vLLM /metrics page is some hundred KiB.
const maxBody = 16 << 20

// Scraper reads engines' /metrics.
type Scraper struct {
	// Client does the request; nil means http.DefaultClient. The caller's
	// context carries the deadline.
	Client *http.Client
}

// Scrape fetches baseURL + "/metrics" and extracts the Evidence. On any
// failure it returns the zero Evidence ("no evidence") and the error, so the
// caller can log why and still plan.
func (s Scraper) Scrape(ctx context.Context, baseURL string) (Evidence, error) {
	url := strings.TrimSuffix(baseURL, "/") + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Evidence{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return Evidence{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Evidence{}, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	format := expfmt.ResponseFormat(resp.Header)
	if format.FormatType() == expfmt.TypeUnknown {
		format = expfmt.NewFormat(expfmt.TypeTextPlain)
	}
	ev, err := Parse(io.LimitReader(resp.Body, maxBody), format)
	if err != nil {
		return Evidence{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	return ev, nil
}

// Parse decodes a metrics exposition in the given format (text or
// OpenMetrics) and extracts the Evidence.
func Parse(r io.Reader, format expfmt.Format) (Evidence, error) {
	dec := expfmt.NewDecoder(r, format)
	families := make(map[string]*dto.MetricFamily)
	for {
		mf := new(dto.MetricFamily)
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Evidence{}, fmt.Errorf("parse metrics: %w", err)
		}
		families[mf.GetName()] = mf
	}
	var ev Evidence
	switch {
	case families[VLLMRunning] != nil || families[VLLMWaiting] != nil:
		ev = Evidence{Engine: "vllm", Running: sum(families[VLLMRunning]), Waiting: sum(families[VLLMWaiting])}
	case families[SGLangRunning] != nil || families[SGLangWaiting] != nil:
		ev = Evidence{Engine: "sglang", Running: sum(families[SGLangRunning]), Waiting: sum(families[SGLangWaiting])}
	}
	ev.SleepState = sleepState(families[VLLMSleepState])
	return ev, nil
}

// sum adds a gauge's (or untyped or counter) samples over all label sets.
// Counts are whole numbers; a fractional or negative sum is clamped so the
// evidence never claims less work than published.
func sum(mf *dto.MetricFamily) int {
	var total float64
	for _, m := range mf.GetMetric() {
		switch {
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Untyped != nil:
			total += m.GetUntyped().GetValue()
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		}
	}
	switch {
	case !(total > 0): // also NaN
		return 0
	case total > 1<<31:
		return 1 << 31
	}
	n := int(total)
	if float64(n) < total {
		n++
	}
	return n
}

// sleepState is the sleep_state label of the series whose value is set:
// vLLM publishes one series per state and sets the current one to 1.
func sleepState(mf *dto.MetricFamily) string {
	for _, m := range mf.GetMetric() {
		if m.GetGauge().GetValue() <= 0 && m.GetUntyped().GetValue() <= 0 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == "sleep_state" {
				return l.GetValue()
			}
		}
	}
	return ""
}
