// Package metrics defines napd's Prometheus metrics. Counters and histograms
// are updated as things happen; gauges (model state, queue depth, leases,
// memory) are read from the agent's published snapshots at scrape time, so a
// model removed by a reload disappears from the output instead of going stale.
package metrics

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// States lists every lifecycle state, so napd_model_state has one series per
// state (1 for the current one) and a dashboard can graph transitions.
var States = []string{"awake", "draining", "sleeping", "waking", "unverified", "unsupported", "failed"}

// Model is one model's gauges at scrape time.
type Model struct {
	Name        string
	State       string
	QueueDepth  int
	Leases      int
	EngineBytes int64 // engine's own memory (cgroup); <0 = not measured
	GPUBytes    map[string]int64
}

// GPU is one device's memory at scrape time.
type GPU struct {
	Index       string
	Total, Used int64
}

// Snapshot is what the agent reports at scrape time.
type Snapshot struct {
	Models        []Model
	GPUs          []GPU
	HostAvailable int64 // <0 = not measured
	PSISomeAvg10  float64
	HavePSI       bool
}

// Metrics holds napd's collectors.
type Metrics struct {
	reg        *prometheus.Registry
	Wakes      *prometheus.CounterVec   // model, result
	Sleeps     *prometheus.CounterVec   // model, reason
	WakeTime   *prometheus.HistogramVec // model
	Requests   *prometheus.CounterVec   // model, code
	Decisions  *prometheus.CounterVec   // model, action, reason
	Reloads    *prometheus.CounterVec   // result
	snapshotFn func() Snapshot
}

// New registers every metric. snapshot is called at each scrape.
func New(snapshot func() Snapshot) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		Wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_wakes_total", Help: "Wake attempts by model and result (ok, unhealthy, timeout, exited).",
		}, []string{"model", "result"}),
		Sleeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_sleeps_total", Help: "Models put to sleep, by reason (idle, gpu-pressure, host-pressure, psi-pressure, make-room, operator).",
		}, []string{"model", "reason"}),
		WakeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "napd_wake_duration_seconds",
			Help:    "Time from the start of a wake to a verified healthy engine.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"model"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_requests_total", Help: "Gateway requests by model and HTTP status code.",
		}, []string{"model", "code"}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_planner_decisions_total", Help: "Planner decisions by model, action and reason.",
		}, []string{"model", "action", "reason"}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napd_config_reloads_total", Help: "Configuration reloads by result (ok, invalid).",
		}, []string{"result"}),
		snapshotFn: snapshot,
	}
	m.reg.MustRegister(m.Wakes, m.Sleeps, m.WakeTime, m.Requests, m.Decisions, m.Reloads,
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
	for _, v := range []*prometheus.CounterVec{m.Wakes, m.Sleeps, m.Requests, m.Decisions} {
		v.DeletePartialMatch(prometheus.Labels{"model": model})
	}
	m.WakeTime.DeletePartialMatch(prometheus.Labels{"model": model})
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
	descGPUTotal = prometheus.NewDesc("napd_gpu_memory_total_bytes",
		"Total memory of each GPU.", []string{"gpu"}, nil)
	descGPUUsed = prometheus.NewDesc("napd_gpu_memory_used_bytes",
		"Used memory of each GPU.", []string{"gpu"}, nil)
	descHostAvail = prometheus.NewDesc("napd_host_memory_available_bytes",
		"Host MemAvailable.", nil, nil)
	descPSI = prometheus.NewDesc("napd_memory_pressure_some_avg10",
		"Memory PSI 'some' avg10 (percent).", nil, nil)
)

// gauges is the scrape-time collector over the agent's snapshot.
type gauges Metrics

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descQueue, descLeases, descEngineMem,
		descModelGPU, descGPUTotal, descGPUUsed, descHostAvail, descPSI} {
		ch <- d
	}
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	s := g.snapshotFn()
	for _, m := range s.Models {
		for _, st := range States {
			v := 0.0
			if st == m.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, m.Name, st)
		}
		ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(m.QueueDepth), m.Name)
		ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(m.Leases), m.Name)
		if m.EngineBytes >= 0 {
			ch <- prometheus.MustNewConstMetric(descEngineMem, prometheus.GaugeValue, float64(m.EngineBytes), m.Name)
		}
		for gpu, b := range m.GPUBytes {
			ch <- prometheus.MustNewConstMetric(descModelGPU, prometheus.GaugeValue, float64(b), m.Name, gpu)
		}
	}
	for _, d := range s.GPUs {
		ch <- prometheus.MustNewConstMetric(descGPUTotal, prometheus.GaugeValue, float64(d.Total), d.Index)
		ch <- prometheus.MustNewConstMetric(descGPUUsed, prometheus.GaugeValue, float64(d.Used), d.Index)
	}
	if s.HostAvailable >= 0 {
		ch <- prometheus.MustNewConstMetric(descHostAvail, prometheus.GaugeValue, float64(s.HostAvailable))
	}
	if s.HavePSI {
		ch <- prometheus.MustNewConstMetric(descPSI, prometheus.GaugeValue, s.PSISomeAvg10)
	}
}

// Request counts one gateway reply.
func (m *Metrics) Request(model string, status int) {
	m.Requests.WithLabelValues(model, strconv.Itoa(status)).Inc()
}
