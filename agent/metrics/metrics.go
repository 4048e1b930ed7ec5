// Package metrics defines napd's Prometheus metrics. Counters and histograms
// are updated as things happen; gauges (model state, queue depth, leases,
// memory) are read from the agent's published snapshots at scrape time, so a
// model removed by a reload disappears from the output instead of going stale.
//
// It owns the collectors and their label sets. It must not keep model state
// of its own: gauges are read from the snapshot at scrape time, and label
// values are bounded by the config and the keys file.
package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/gateway"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Model is one model's gauges at scrape time.
type Model struct {
	Name        string
	State       lifecycle.State
	QueueDepth  int
	Leases      int
	EngineBytes int64 // engine's own memory (cgroup); <0 = not measured
	GPUBytes    map[string]int64
	// WeightsBytes of weight files napd knows of (0: none, no series),
	// WeightsResident of them in the page cache.
	WeightsBytes, WeightsResident int64
}

// GPU is one device's memory at scrape time.
type GPU struct {
	Index       string
	Vendor      string // "nvidia", "amd", "intel"
	Total, Used int64
}

// Snapshot is what the agent reports at scrape time.
type Snapshot struct {
	Models        []Model
	GPUs          []GPU
	HostAvailable int64 // <0 = not measured
	PSISomeAvg10  float64
	HavePSI       bool
	// Usage is each key's use of each model since the usage ledger began
	// (agent/usage: it survives restarts).
	Usage []KeyUsage
}

// KeyUsage is one key's use of one model, in total.
type KeyUsage struct {
	Key, Model   string
	ByteSeconds  float64
	Wakes, Swaps int64
}

// Metrics holds napd's collectors.
type Metrics struct {
	reg        *prometheus.Registry
	Wakes      *prometheus.CounterVec   // model, result
	Sleeps     *prometheus.CounterVec   // model, reason
	WakeTime   *prometheus.HistogramVec // model
	Requests   *prometheus.CounterVec   // model, client, code
	Decisions  *prometheus.CounterVec   // model, action, reason
	Reloads    *prometheus.CounterVec   // result
	RoomWaits  *prometheus.CounterVec   // model
	RoomWait   *prometheus.HistogramVec // model
	Swaps      *prometheus.CounterVec   // model, reason
	Overflows  *prometheus.CounterVec   // model, target, code
	snapshotFn func() Snapshot

	// Per request, by model, kind and stream.
	duration, firstByte, queueWait, wakeWait *prometheus.HistogramVec
	// By model and client.
	promptTokens, completionTokens *prometheus.CounterVec
	// clients is the set of names the client label may take (the current
	// keys file's); nil while no keys file bounds it.
	clients atomic.Pointer[map[string]bool]

	// The series of each request label set, looked up once rather than
	// by label values, metric by metric, on every request. Emptied, under
	// the write lock, with every deletion of series, so no handle
	// outlives its series.
	mu      sync.RWMutex
	handles map[requestKey]requestSeries
}

// requestKey is what labels a request's series.
type requestKey struct {
	model, client, kind string
	stream              bool
	status              int
}

// requestSeries are the series a request updates, each nil until a
// request needs it: a series exists only once something was counted in it.
type requestSeries struct {
	requests, prompt, completion             prometheus.Counter
	duration, queueWait, firstByte, wakeWait prometheus.Observer
}

// waitBuckets are the buckets (seconds) of a wake and of a wait for GPU
// memory: from a sleeping engine's resume to a large model's cold load.
var waitBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// RequestBuckets are the request histograms' buckets (seconds): from a
// cached embedding (10 ms) to a long generation behind a cold wake (10 min).
var RequestBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}

func requestHistogram(name, help string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: RequestBuckets},
		[]string{"model", "kind", "stream"})
}

// New registers every metric. snapshot is called at each scrape.
func New(snapshot func() Snapshot) *Metrics {
	m := &Metrics{
		reg:     prometheus.NewRegistry(),
		handles: map[requestKey]requestSeries{},
		Wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_wakes_total", Help: "Wake attempts by model and result (ok, unhealthy, timeout, exited).",
		}, []string{"model", "result"}),
		Sleeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_sleeps_total", Help: "Models put to sleep, by reason (idle, gpu-pressure, host-pressure, psi-pressure, make-room, operator).",
		}, []string{"model", "reason"}),
		WakeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "napd_wake_duration_seconds",
			Help:    "Time from the start of a wake to a verified healthy engine.",
			Buckets: waitBuckets,
		}, []string{"model"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_requests_total",
			Help: "Gateway requests by model (\"\" when none was resolved), client (the API key's name) and HTTP status code (499: the client left first).",
		}, []string{"model", "client", "code"}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_planner_decisions_total", Help: "Planner decisions by model, action and reason.",
		}, []string{"model", "action", "reason"}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_config_reloads_total", Help: "Configuration reloads by result (ok, invalid).",
		}, []string{"result"}),
		RoomWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_room_waits_total", Help: "Wakes that had to wait for GPU memory held by other models, by the waiting model.",
		}, []string{"model"}),
		RoomWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "napd_room_wait_seconds",
			Help:    "How long a wake waited for GPU memory, until it fitted, was refused or its requests left.",
			Buckets: waitBuckets,
		}, []string{"model"}),
		Swaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_swaps_total", Help: "Models put to sleep for another model waiting for their memory, by reason (make-room: idle, yield: busy).",
		}, []string{"model", "reason"}),
		Overflows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_overflow_requests_total",
			Help: "Requests sent to an overflow target (a remote model) instead of the model they asked for, by that model, the target and HTTP status code.",
		}, []string{"model", "target", "code"}),
		snapshotFn: snapshot,
		duration: requestHistogram("napd_request_duration_seconds",
			"Admitted requests: time from arrival to the last byte of the answer."),
		firstByte: requestHistogram("napd_request_first_byte_seconds",
			"Admitted requests: time from arrival to the first byte of the engine's answer (the first token of a stream)."),
		queueWait: requestHistogram("napd_request_queue_wait_seconds",
			"Admitted requests: time waiting for a concurrency slot."),
		wakeWait: requestHistogram("napd_request_wake_wait_seconds",
			"Requests that waited for a wake: time waiting for it, including making room."),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_prompt_tokens_total", Help: "Prompt tokens by model and client, from the engine's usage object.",
		}, []string{"model", "client"}),
		completionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_completion_tokens_total", Help: "Completion tokens by model and client, from the engine's usage object.",
		}, []string{"model", "client"}),
	}
	m.reg.MustRegister(m.Wakes, m.Sleeps, m.WakeTime, m.Requests, m.Decisions, m.Reloads, m.RoomWaits, m.RoomWait, m.Swaps, m.Overflows,
		m.duration, m.firstByte, m.queueWait, m.wakeWait, m.promptTokens, m.completionTokens,
		(*gauges)(m),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Forget drops the counters of a model removed by a reload.
func (m *Metrics) Forget(model string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropHandles()
	for _, v := range []*prometheus.CounterVec{m.Wakes, m.Sleeps, m.Requests, m.Decisions, m.promptTokens, m.completionTokens, m.RoomWaits, m.Swaps} {
		v.DeletePartialMatch(prometheus.Labels{"model": model})
	}
	for _, v := range []*prometheus.HistogramVec{m.WakeTime, m.duration, m.firstByte, m.queueWait, m.wakeWait, m.RoomWait} {
		v.DeletePartialMatch(prometheus.Labels{"model": model})
	}
	m.Overflows.DeletePartialMatch(prometheus.Labels{"model": model})
	m.Overflows.DeletePartialMatch(prometheus.Labels{"target": model})
}

// SetClients bounds the client label to names (the current keys file's;
// nil: no keys file, no bound) and drops the series of every other client.
// A request of a removed key that finishes after the reload is counted
// without a client name, so the dropped series do not come back.
func (m *Metrics) SetClients(names []string) {
	var set map[string]bool
	if names != nil {
		set = make(map[string]bool, len(names))
		for _, n := range names {
			set[n] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.clients.Swap(&set)
	if prev == nil || *prev == nil {
		return
	}
	m.dropHandles()
	for n := range *prev {
		if !set[n] {
			for _, v := range []*prometheus.CounterVec{m.Requests, m.promptTokens, m.completionTokens} {
				v.DeletePartialMatch(prometheus.Labels{"client": n})
			}
		}
	}
}

// client is the label value for a request's client name.
func (m *Metrics) client(name string) string {
	if set := m.clients.Load(); set != nil && *set != nil && !(*set)[name] {
		return ""
	}
	return name
}

var (
	descState = prometheus.NewDesc("napd_model_state",
		"Lifecycle state of each model: 1 for the current state, 0 for the others.", []string{"model", "state"}, nil)
	descQueue = prometheus.NewDesc("napd_queue_depth",
		"Requests waiting for a concurrency slot.", []string{"model"}, nil)
	descLeases = prometheus.NewDesc("napd_leases_in_flight",
		"Requests holding a lease (queued, waiting for a wake, or being served).", []string{"model"}, nil)
	descEngineMem = prometheus.NewDesc("napd_engine_memory_bytes",
		"Host memory of the model's engine (its cgroup).", []string{"model"}, nil)
	descModelGPU = prometheus.NewDesc("napd_model_gpu_memory_bytes",
		"GPU memory held by the model's engine processes.", []string{"model", "gpu"}, nil)
	descWeights = prometheus.NewDesc("napd_weights_bytes",
		"Size of the model's weight files napd knows of (docs/memory.md#weights-kept-warm).", []string{"model"}, nil)
	descWeightsResident = prometheus.NewDesc("napd_weights_resident_bytes",
		"Of the model's weight files, the bytes in the host's page cache.", []string{"model"}, nil)
	descGPUTotal = prometheus.NewDesc("napd_gpu_memory_total_bytes",
		"Total memory of each GPU (a MIG instance is one), by napd's index and vendor.", []string{"gpu", "vendor"}, nil)
	descGPUUsed = prometheus.NewDesc("napd_gpu_memory_used_bytes",
		"Used memory of each GPU (a MIG instance is one), by napd's index and vendor.", []string{"gpu", "vendor"}, nil)
	descHostAvail = prometheus.NewDesc("napd_host_memory_available_bytes",
		"Host MemAvailable.", nil, nil)
	descPSI = prometheus.NewDesc("napd_memory_pressure_some_avg10",
		"Memory PSI 'some' avg10 (percent).", nil, nil)
	descByteSeconds = prometheus.NewDesc("napd_gpu_byte_seconds_total",
		"GPU memory held on a key's behalf, integrated over time: the model's measured footprint times the key's share of its requests in flight (docs/keys.md#gpu-time). Kept across restarts.", []string{"key", "model"}, nil)
	descWakesCaused = prometheus.NewDesc("napd_wakes_caused_total",
		"Wakes of a model that a key's request started. Kept across restarts.", []string{"key", "model"}, nil)
	descSwapsCaused = prometheus.NewDesc("napd_swaps_caused_total",
		"Of those, wakes that waited for other models to give GPU memory back. Kept across restarts.", []string{"key", "model"}, nil)
)

// gauges is the scrape-time collector over the agent's snapshot.
type gauges Metrics

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descQueue, descLeases, descEngineMem,
		descModelGPU, descWeights, descWeightsResident, descGPUTotal, descGPUUsed, descHostAvail, descPSI, descByteSeconds, descWakesCaused, descSwapsCaused} {
		ch <- d
	}
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	s := g.snapshotFn()
	for _, m := range s.Models {
		// One series per lifecycle state (1 for the current one), so a
		// dashboard can graph transitions.
		for _, st := range lifecycle.States() {
			v := 0.0
			if st == m.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, m.Name, st.String())
		}
		ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(m.QueueDepth), m.Name)
		ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(m.Leases), m.Name)
		if m.EngineBytes >= 0 {
			ch <- prometheus.MustNewConstMetric(descEngineMem, prometheus.GaugeValue, float64(m.EngineBytes), m.Name)
		}
		if m.WeightsBytes > 0 {
			ch <- prometheus.MustNewConstMetric(descWeights, prometheus.GaugeValue, float64(m.WeightsBytes), m.Name)
			ch <- prometheus.MustNewConstMetric(descWeightsResident, prometheus.GaugeValue, float64(m.WeightsResident), m.Name)
		}
		for gpu, b := range m.GPUBytes {
			ch <- prometheus.MustNewConstMetric(descModelGPU, prometheus.GaugeValue, float64(b), m.Name, gpu)
		}
	}
	for _, d := range s.GPUs {
		ch <- prometheus.MustNewConstMetric(descGPUTotal, prometheus.GaugeValue, float64(d.Total), d.Index, d.Vendor)
		ch <- prometheus.MustNewConstMetric(descGPUUsed, prometheus.GaugeValue, float64(d.Used), d.Index, d.Vendor)
	}
	if s.HostAvailable >= 0 {
		ch <- prometheus.MustNewConstMetric(descHostAvail, prometheus.GaugeValue, float64(s.HostAvailable))
	}
	if s.HavePSI {
		ch <- prometheus.MustNewConstMetric(descPSI, prometheus.GaugeValue, s.PSISomeAvg10)
	}
	for _, u := range s.Usage {
		// A key removed from the keys file has no series (its figures
		// stay in the ledger, for napctl usage).
		if key := (*Metrics)(g).client(u.Key); key == u.Key {
			ch <- prometheus.MustNewConstMetric(descByteSeconds, prometheus.CounterValue, u.ByteSeconds, u.Key, u.Model)
			ch <- prometheus.MustNewConstMetric(descWakesCaused, prometheus.CounterValue, float64(u.Wakes), u.Key, u.Model)
			ch <- prometheus.MustNewConstMetric(descSwapsCaused, prometheus.CounterValue, float64(u.Swaps), u.Key, u.Model)
		}
	}
}

// Request records one finished gateway request. Label values are bounded:
// models by the config, clients by the keys file, kinds by the gateway.
func (m *Metrics) Request(o gateway.Observation) {
	admitted := o.Admitted && o.Model != ""
	s := m.series(requestKey{o.Model, m.client(o.Client), string(o.Kind), o.Stream, o.Status},
		admitted, admitted && o.FirstByte > 0, admitted && o.WakeWait > 0, admitted && o.HasUsage)
	s.requests.Inc()
	if !admitted {
		return
	}
	if o.ServedBy != "" {
		// Label values bounded by the config: targets are remote models.
		m.Overflows.WithLabelValues(o.Model, o.ServedBy, strconv.Itoa(o.Status)).Inc()
	}
	s.duration.Observe(o.Duration.Seconds())
	s.queueWait.Observe(o.QueueWait.Seconds())
	if o.FirstByte > 0 {
		s.firstByte.Observe(o.FirstByte.Seconds())
	}
	if o.WakeWait > 0 {
		s.wakeWait.Observe(o.WakeWait.Seconds())
	}
	if o.HasUsage {
		s.prompt.Add(float64(o.Usage.PromptTokens))
		s.completion.Add(float64(o.Usage.CompletionTokens))
	}
}

// series are k's series, with those a request needs beyond the request
// counter (the histograms of an admitted request, first byte, wake wait,
// tokens) made on first use.
func (m *Metrics) series(k requestKey, admitted, firstByte, wake, usage bool) requestSeries {
	m.mu.RLock()
	s, ok := m.handles[k]
	m.mu.RUnlock()
	if ok && (!admitted || s.duration != nil) && (!firstByte || s.firstByte != nil) &&
		(!wake || s.wakeWait != nil) && (!usage || s.prompt != nil) {
		return s
	}
	// Made under the write lock: a deletion cannot fall between the
	// series' making and its handle's caching.
	m.mu.Lock()
	defer m.mu.Unlock()
	// Again under the lock: a key removed by SetClients since must not
	// bring its series back.
	k.client = m.client(k.client)
	s = m.handles[k]
	if s.requests == nil {
		s.requests = m.Requests.WithLabelValues(k.model, k.client, strconv.Itoa(k.status))
	}
	stream := strconv.FormatBool(k.stream)
	if admitted && s.duration == nil {
		s.duration = m.duration.WithLabelValues(k.model, k.kind, stream)
		s.queueWait = m.queueWait.WithLabelValues(k.model, k.kind, stream)
	}
	if firstByte && s.firstByte == nil {
		s.firstByte = m.firstByte.WithLabelValues(k.model, k.kind, stream)
	}
	if wake && s.wakeWait == nil {
		s.wakeWait = m.wakeWait.WithLabelValues(k.model, k.kind, stream)
	}
	if usage && s.prompt == nil {
		s.prompt = m.promptTokens.WithLabelValues(k.model, k.client)
		s.completion = m.completionTokens.WithLabelValues(k.model, k.client)
	}
	m.handles[k] = s
	return s
}

// dropHandles empties the handle cache; m.mu is held for writing.
func (m *Metrics) dropHandles() { clear(m.handles) }
