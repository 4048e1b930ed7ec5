package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

	"github.com/napd/napd/probes/enginemetrics"
)

// EnginesPath is where the metrics listener serves the engines' own
// metrics.
const EnginesPath = "/metrics/engines"

// EngineTarget is one model's engine as EnginesHandler sees it.
type EngineTarget struct {
	Model string
	// URL is the root of the engine while it serves; "" while it does
	// not (asleep, waking, failed): such a model has no samples, and
	// nothing is asked of its engine.
	URL string
}

// Engine scrape timeouts: Prometheus says its own in a header; without
// one, DefaultEngineScrape; never more than MaxEngineScrape.
const (
	DefaultEngineScrape = 5 * time.Second
	MaxEngineScrape     = 10 * time.Second
)

// EngineUp is the family saying, per model, whether its engine's metrics
// were read this scrape.
const EngineUp = "napd_engine_metrics_up"

// EnginesHandler serves GET EnginesPath: every serving engine's own
// /metrics in one exposition, each sample labelled model="NAME"
// (?model=NAME: that model's only, by name; 404 for a name napd does not
// have). It is a plain read of the engine: no wake, no lease, no request
// counted, so a Prometheus job scraping it keeps no model awake. Engines
// are scraped at once, each within the scrape's timeout; one that fails
// is left out and its EngineUp is 0.
func EnginesHandler(targets func() []EngineTarget, scrape func(ctx context.Context, url string) ([]*dto.MetricFamily, error), log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		all := targets()
		if name := r.URL.Query().Get("model"); name != "" {
			var one []EngineTarget
			for _, t := range all {
				if t.Model == name {
					one = append(one, t)
				}
			}
			if len(one) == 0 {
				http.Error(w, "no model named "+strconv.Quote(name), http.StatusNotFound)
				return
			}
			all = one
		}
		ctx, cancel := context.WithTimeout(r.Context(), scrapeTimeout(r))
		defer cancel()
		var (
			mu     sync.Mutex
			wg     sync.WaitGroup
			per    = map[string][]*dto.MetricFamily{}
			up     = map[string]bool{}
			models []string
		)
		for _, t := range all {
			if t.URL == "" {
				continue
			}
			models = append(models, t.Model)
			wg.Go(func() {
				fams, err := scrape(ctx, t.URL)
				if err != nil {
					log.Debug("engine metrics", "model", t.Model, "err", err)
				}
				mu.Lock()
				per[t.Model], up[t.Model] = fams, err == nil
				mu.Unlock()
			})
		}
		wg.Wait()
		fams, dropped := enginemetrics.Labelled(models, per)
		if len(dropped) > 0 {
			log.Debug("engine metrics left out: their type differs between engines", "families", dropped)
		}
		if len(models) > 0 {
			fams = append(fams, upFamily(models, up))
		}
		format := expfmt.NewFormat(expfmt.TypeTextPlain)
		w.Header().Set("Content-Type", string(format))
		enc := expfmt.NewEncoder(w, format)
		for _, mf := range fams {
			if err := enc.Encode(mf); err != nil {
				log.Debug("engine metrics: writing", "err", err)
				return
			}
		}
	})
}

// scrapeTimeout is Prometheus's timeout for this scrape, less a margin
// for napd's own work, within MaxEngineScrape.
func scrapeTimeout(r *http.Request) time.Duration {
	s, err := strconv.ParseFloat(r.Header.Get("X-Prometheus-Scrape-Timeout-Seconds"), 64)
	if err != nil || s <= 0 {
		return DefaultEngineScrape
	}
	d := time.Duration(s * float64(time.Second))
	return min(max(d-d/10, 100*time.Millisecond), MaxEngineScrape)
}

func upFamily(models []string, up map[string]bool) *dto.MetricFamily {
	mf := &dto.MetricFamily{Name: proto.String(EngineUp), Type: dto.MetricType_GAUGE.Enum(),
		Help: proto.String("Whether napd read the engine's own metrics this scrape (1) or not (0); a model whose engine does not serve has none.")}
	for _, m := range models {
		v := 0.0
		if up[m] {
			v = 1
		}
		mf.Metric = append(mf.Metric, &dto.Metric{
			Label: []*dto.LabelPair{{Name: proto.String(enginemetrics.ModelLabel), Value: proto.String(m)}},
			Gauge: &dto.Gauge{Value: proto.Float64(v)},
		})
	}
	return mf
}
