package enginemetrics

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// Families reads an engine's whole /metrics exposition (bounded like a
// scrape), for napd's re-export of it (agent/metrics.EnginesHandler). It
// only reads: /metrics wakes no engine and, on llama.cpp, does not hold
// off its own idle sleep.
func (s *Scraper) Families(ctx context.Context, baseURL string) ([]*dto.MetricFamily, error) {
	target := strings.TrimSuffix(baseURL, "/") + string(epMetrics)
	resp, err := s.open(ctx, target, true)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := decodeAll(io.LimitReader(resp.Body, maxBody), formatOf(resp))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", target, err)
	}
	return out, nil
}

// ModelLabel is the label napd adds to every sample of an engine's
// metrics: the model's name. A label of that name the engine set itself
// is kept as exported_model, as Prometheus keeps a clashing target label.
const ModelLabel = "model"

// Labelled merges the engines' expositions into one: every sample gets
// ModelLabel with its model's name, and the families of one name from
// several engines become one family. A family whose type differs from
// the one first seen under its name (another engine's metric that
// happens to share it) is left out rather than written under a wrong
// TYPE; dropped names it. Families come out sorted by name, the models'
// samples in the order of models.
func Labelled(models []string, per map[string][]*dto.MetricFamily) (out []*dto.MetricFamily, dropped []string) {
	byName := map[string]*dto.MetricFamily{}
	for _, model := range models {
		for _, mf := range per[model] {
			merged := byName[mf.GetName()]
			switch {
			case merged == nil:
				merged = &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit}
				byName[mf.GetName()] = merged
			case merged.GetType() != mf.GetType():
				dropped = append(dropped, fmt.Sprintf("%s of model %s (%s, not %s)", mf.GetName(), model, mf.GetType(), merged.GetType()))
				continue
			}
			for _, m := range mf.GetMetric() {
				merged.Metric = append(merged.Metric, withModel(m, model))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[name])
	}
	return out, dropped
}

// withModel is a copy of m with ModelLabel set to model.
func withModel(m *dto.Metric, model string) *dto.Metric {
	c := proto.Clone(m).(*dto.Metric)
	labels := make([]*dto.LabelPair, 0, len(c.Label)+1)
	labels = append(labels, &dto.LabelPair{Name: proto.String(ModelLabel), Value: proto.String(model)})
	for _, l := range c.Label {
		if l.GetName() == ModelLabel {
			l = &dto.LabelPair{Name: proto.String("exported_" + ModelLabel), Value: l.Value}
		}
		labels = append(labels, l)
	}
	c.Label = labels
	return c
}
