// Package enginemetrics asks an engine what it is doing, for the evidence
// the planner and the health watch need: how many requests the engine
// itself is running and queueing, whether its work counters move, vLLM's
// own sleep state, and the models Ollama holds.
//
// Adapters, tried in this order on the engine's HTTP root:
//   - GET /metrics (Prometheus text or OpenMetrics): the operator's own
//     activity metric names first, then vLLM, SGLang, llama.cpp's server
//     (with --metrics) and TGI;
//   - GET /slots: llama.cpp's server without --metrics (is_processing);
//   - GET /api/ps: Ollama, which publishes no request counts, only the
//     models it holds and when it unloads them itself.
//
// The package keeps no state and starts no goroutine; Scraper remembers
// which adapter answered each engine so that an engine is not asked for
// endpoints it lacks every round.
//
// It only reads: it must not call an engine's control endpoints, and the
// caller asks it only about engines that serve (asking a sleeping vLLM
// anything else is not safe).
package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metric names engines publish. vLLM and SGLang report per-engine series
// with labels (model_name, engine, tp_rank); the counts are summed.
const (
	VLLMRunning        = "vllm:num_requests_running"
	VLLMWaiting        = "vllm:num_requests_waiting"
	VLLMSleepState     = "vllm:engine_sleep_state"
	SGLangRunning      = "sglang:num_running_reqs"
	SGLangWaiting      = "sglang:num_queue_reqs"
	LlamaCppProcessing = "llamacpp:requests_processing"
	LlamaCppDeferred   = "llamacpp:requests_deferred"
	TGIBatch           = "tgi_batch_current_size"
	TGIQueue           = "tgi_queue_size"
)

// Engine names the adapter whose evidence an Evidence is.
type Engine string

// Engines.
const (
	EngineVLLM     Engine = "vllm"
	EngineSGLang   Engine = "sglang"
	EngineLlamaCpp Engine = "llamacpp"
	EngineTGI      Engine = "tgi"
	EngineOllama   Engine = "ollama"
	// EngineCustom: the operator's activity_metrics.
	EngineCustom Engine = "custom"
	// EngineWorker is never scraped: a ZMQ worker (engine/) serves one
	// napd session at a time, so napd's leases are its whole work and the
	// caller vouches for it with Counts and no request beside them.
	EngineWorker Engine = "worker"
)

// adapter is one engine's metric names: what counts as running and
// waiting, and the counters that grow while it works.
type adapter struct {
	engine           Engine
	running, waiting string
	progress         []string
}

var adapters = []adapter{
	{EngineVLLM, VLLMRunning, VLLMWaiting, []string{"vllm:generation_tokens_total", "vllm:prompt_tokens_total"}},
	{EngineSGLang, SGLangRunning, SGLangWaiting, []string{"sglang:generation_tokens_total", "sglang:prompt_tokens_total"}},
	{EngineLlamaCpp, LlamaCppProcessing, LlamaCppDeferred, []string{"llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total", "llamacpp:n_decode_total"}},
	{EngineTGI, TGIBatch, TGIQueue, nil},
}

// Evidence is what an engine says about its own work. The zero value is
// "no evidence": the engine publishes nothing napd can read, or could not
// be asked.
type Evidence struct {
	// Engine names the adapter that answered; "" means no evidence.
	Engine Engine
	// Counts is true when Running and Waiting are the engine's own
	// figures; false for Ollama, which publishes none.
	Counts  bool
	Running int
	Waiting int
	// SleepState is vLLM's engine_sleep_state ("awake", "weights_offloaded",
	// "discard_all"), "" when not published.
	SleepState string
	// Progress sums the engine's work counters (tokens processed, decode
	// steps); it only grows while the engine works. Compare two readings of
	// one engine; HaveProgress is false when it publishes none.
	Progress     float64
	HaveProgress bool
	// Held is what Ollama holds (from /api/ps).
	Held []Held
}

// Held is one model Ollama holds in memory.
type Held struct {
	Name string
	// ExpiresAt is when Ollama unloads it by itself (about year 2319 for
	// a forever keep-alive).
	ExpiresAt time.Time
	SizeVRAM  int64
}

// Have reports whether the engine gave request counts: evidence that can
// prove it idle.
func (e Evidence) Have() bool { return e.Counts }

// Idle reports evidence of no running and no waiting request.
func (e Evidence) Idle() bool { return e.Counts && e.Running == 0 && e.Waiting == 0 }

// maxBody bounds a scrape; a vLLM /metrics page is some hundred KiB.
const maxBody = 16 << 20

// recheck is how long an engine that answered no adapter is left alone
// before it is asked again (it may have been loading, or restarted).
const recheck = time.Minute

// endpoint is an adapter's path.
type endpoint string

const (
	epMetrics endpoint = "/metrics"
	epSlots   endpoint = "/slots"
	epOllama  endpoint = "/api/ps"
	epNone    endpoint = ""
)

var endpoints = []endpoint{epMetrics, epSlots, epOllama}

// Scraper asks engines for their evidence. It remembers which endpoint
// answered each engine root; safe for concurrent use.
type Scraper struct {
	// Client does the requests; nil means http.DefaultClient. The caller's
	// context carries the deadline.
	Client *http.Client
	// Now is the clock for the recheck of engines without evidence; nil
	// means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	known map[string]found
}

type found struct {
	ep    endpoint
	until time.Time // for epNone: when to ask again
	// quiet: epNone was found by a quiet scrape, which did not ask every
	// endpoint; a plain scrape asks them all anyway.
	quiet bool
}

// errNoAdapter is an endpoint that answered, but not in a form napd reads.
var errNoAdapter = errors.New("no known activity metrics")

// Scrape asks the engine at baseURL for its evidence; custom are the
// operator's activity metric names (may be nil). On any failure it returns
// the zero Evidence ("no evidence") and the error, so the caller can log
// why and still plan.
func (s *Scraper) Scrape(ctx context.Context, baseURL string, custom []string) (Evidence, error) {
	return s.scrape(ctx, baseURL, custom, endpoints)
}

// quietEndpoints are the endpoints that are no work to any engine:
// llama.cpp's /slots is a task, which wakes a llama-server asleep by
// itself and holds its idle sleep off; its /metrics is not.
var quietEndpoints = []endpoint{epMetrics, epOllama}

// ScrapeQuiet is Scrape asking only what an engine does not count as
// work: for an engine that sleeps by itself when idle (llama-server
// --sleep-idle-seconds), which a scrape must neither wake nor keep awake.
func (s *Scraper) ScrapeQuiet(ctx context.Context, baseURL string, custom []string) (Evidence, error) {
	return s.scrape(ctx, baseURL, custom, quietEndpoints)
}

func (s *Scraper) scrape(ctx context.Context, baseURL string, custom []string, eps []endpoint) (Evidence, error) {
	root := strings.TrimSuffix(baseURL, "/")
	now := s.now()
	s.mu.Lock()
	f, ok := s.known[root]
	s.mu.Unlock()
	quiet := len(eps) < len(endpoints)
	if ok && f.ep == epNone && now.Before(f.until) && (quiet || !f.quiet) {
		return Evidence{}, fmt.Errorf("scrape %s: %w (asked again after %s)", root, errNoAdapter, f.until.Sub(now).Round(time.Second))
	}
	if ok && f.ep != epNone && slices.Contains(eps, f.ep) {
		ev, err := s.ask(ctx, root, f.ep, custom)
		if err == nil {
			return ev, nil
		}
		s.forget(root)
		return Evidence{}, err
	}
	var errs []error
	for _, ep := range eps {
		ev, err := s.ask(ctx, root, ep, custom)
		if err == nil {
			s.remember(root, found{ep: ep})
			return ev, nil
		}
		errs = append(errs, err)
		var unreachable *url.Error
		var status *statusError
		if errors.As(err, &unreachable) || errors.As(err, &status) && status.code == http.StatusServiceUnavailable {
			// Refused, timed out, or loading (llama.cpp answers 503
			// everywhere while it loads): ask everything again next time.
			return Evidence{}, err
		}
	}
	s.remember(root, found{ep: epNone, until: now.Add(recheck), quiet: quiet})
	return Evidence{}, errors.Join(errs...)
}

func (s *Scraper) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Scraper) remember(root string, f found) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		s.known = make(map[string]found)
	}
	s.known[root] = f
}

func (s *Scraper) forget(root string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.known, root)
}

// statusError is an endpoint that answered with another status than 200.
type statusError struct {
	url  string
	code int
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s: %d %s", e.url, e.code, http.StatusText(e.code))
}

// ask reads one endpoint and parses it with its adapter.
func (s *Scraper) ask(ctx context.Context, root string, ep endpoint, custom []string) (Evidence, error) {
	target := root + string(ep)
	resp, err := s.open(ctx, target, ep == epMetrics)
	if err != nil {
		return Evidence{}, err
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, maxBody)
	var ev Evidence
	switch ep {
	case epMetrics:
		ev, err = Parse(body, formatOf(resp), custom)
		if err == nil && !ev.Counts {
			err = errNoAdapter
		}
	case epSlots:
		var data []byte
		if data, err = io.ReadAll(body); err == nil {
			ev, err = ParseSlots(data)
		}
	case epOllama:
		var data []byte
		if data, err = io.ReadAll(body); err == nil {
			ev, err = ParseOllamaPS(data)
		}
	}
	if err != nil {
		return Evidence{}, fmt.Errorf("scrape %s: %w", target, err)
	}
	return ev, nil
}

// open GETs target (asking for Prometheus text when metrics is set) and
// returns the response of a 200, whose body the caller closes.
func (s *Scraper) open(ctx context.Context, target string, metrics bool) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", target, err)
	}
	if metrics {
		req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	}
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err) // *url.Error names the URL
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // keep the connection
		resp.Body.Close()
		return nil, fmt.Errorf("scrape: %w", &statusError{target, resp.StatusCode})
	}
	return resp, nil
}

// formatOf is the exposition format of a metrics response; text when it
// does not say.
func formatOf(resp *http.Response) expfmt.Format {
	format := expfmt.ResponseFormat(resp.Header)
	if format.FormatType() == expfmt.TypeUnknown {
		format = expfmt.NewFormat(expfmt.TypeTextPlain)
	}
	return format
}

// decodeAll decodes every family of an exposition.
func decodeAll(r io.Reader, format expfmt.Format) ([]*dto.MetricFamily, error) {
	dec := expfmt.NewDecoder(r, format)
	var out []*dto.MetricFamily
	for {
		mf := new(dto.MetricFamily)
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parse metrics: %w", err)
		}
		out = append(out, mf)
	}
}

// Parse decodes a metrics exposition in the given format (text or
// OpenMetrics) and extracts the Evidence: the first of custom's names, then
// the known engines', that the exposition holds.
func Parse(r io.Reader, format expfmt.Format, custom []string) (Evidence, error) {
	all, err := decodeAll(r, format)
	if err != nil {
		return Evidence{}, err
	}
	families := make(map[string]*dto.MetricFamily, len(all))
	for _, mf := range all {
		families[mf.GetName()] = mf
	}
	var ev Evidence
	if n, ok := sumOf(families, custom); ok {
		ev = Evidence{Engine: EngineCustom, Counts: true, Running: n}
	} else {
		for _, a := range adapters {
			if families[a.running] == nil && families[a.waiting] == nil {
				continue
			}
			ev = Evidence{Engine: a.engine, Counts: true, Running: sum(families[a.running]), Waiting: sum(families[a.waiting])}
			for _, name := range a.progress {
				if mf := families[name]; mf != nil {
					ev.Progress += total(mf)
					ev.HaveProgress = true
				}
			}
			break
		}
	}
	ev.SleepState = sleepState(families[VLLMSleepState])
	return ev, nil
}

// sumOf adds the named families' counts; ok when at least one is present.
func sumOf(families map[string]*dto.MetricFamily, names []string) (n int, ok bool) {
	for _, name := range names {
		if mf := families[name]; mf != nil {
			n += sum(mf)
			ok = true
		}
	}
	return n, ok
}

// total adds a family's gauge, untyped or counter samples over all label
// sets.
func total(mf *dto.MetricFamily) float64 {
	var t float64
	for _, m := range mf.GetMetric() {
		switch {
		case m.Gauge != nil:
			t += m.GetGauge().GetValue()
		case m.Untyped != nil:
			t += m.GetUntyped().GetValue()
		case m.Counter != nil:
			t += m.GetCounter().GetValue()
		}
	}
	return t
}

// sum is total as a count. Counts are whole numbers; a fractional or
// negative sum is clamped so the evidence never claims less work than
// published.
func sum(mf *dto.MetricFamily) int {
	t := total(mf)
	switch {
	case !(t > 0): // also NaN
		return 0
	case t > 1<<31:
		return 1 << 31
	}
	n := int(t)
	if float64(n) < t {
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
