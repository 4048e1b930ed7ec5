package agent

import (
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/metrics"
	"github.com/napd/napd/agent/usage"
	"github.com/napd/napd/gateway"
)

// usageSaveEvery is how often the ticker writes usage.json when it
// changed (and once more when napd stops).
const usageSaveEvery = 30 * time.Second

// quotas is the usage ledger as the gateway asks it about a key's quota.
type quotas struct{ l *usage.Ledger }

func (q quotas) Today(client string, now time.Time) (gateway.Use, time.Time) {
	h, tokens, end := q.l.Today(client, now)
	return gateway.Use{GPUHours: h, Tokens: tokens}, end
}

// observe is the gateway's Observe: the request metrics, and the tokens
// to the usage ledger.
func (a *Agent) observe(o gateway.Observation) {
	a.metrics.Request(o)
	if o.Admitted && o.HasUsage && o.Model != "" {
		a.usage.Tokens(a.clock(), o.Model, o.Client, o.Usage.PromptTokens, o.Usage.CompletionTokens)
	}
}

// meterUsage hands the ledger each model's footprint as measured (the GPU
// memory its engine's processes hold, else what napd expects it to hold)
// and charges the requests in flight up to now.
func (a *Agent) meterUsage(now time.Time) {
	ms := a.desk.Measured()
	totals := map[int]int64{}
	if ms != nil {
		for _, d := range ms.GPUs.Devices {
			if d.HaveMemory {
				totals[d.Index] = d.Total
			}
		}
	}
	for _, m := range a.reg.Load().list {
		s := m.Snapshot()
		bytes := a.desk.Footprint(s).Bytes
		if ms != nil {
			var held int64
			for _, b := range ms.Models[m.Name()].GPUBytes {
				held += b
			}
			if held > 0 {
				bytes = held
			}
		}
		a.usage.Resize(now, m.Name(), bytes, usage.GPUShare(bytes, a.desk.GPUs(s), totals))
	}
	a.usage.Tick(now)
}

// saveUsage writes usage.json, logging a failure (the figures stay in
// memory and are written at the next try).
func (a *Agent) saveUsage() {
	if err := a.usage.Save(); err != nil {
		a.log.Warn("saving usage", "err", err)
	}
}

// Usage implements control.Controller.
func (a *Agent) Usage(since time.Duration) control.Usage {
	now := a.clock()
	from := now.Add(-since).Truncate(time.Hour)
	return control.Usage{Since: from, Rows: usageRows(a.usage.Since(from)), Quotas: a.quotasToday(now)}
}

func usageRows(rows []usage.Row) []control.UsageRow {
	out := make([]control.UsageRow, len(rows))
	for i, r := range rows {
		out[i] = control.UsageRow{Key: r.Key, Model: r.Model, GPUByteSeconds: r.ByteSeconds, GPUHours: r.GPUSeconds / 3600,
			Wakes: r.Wakes, Swaps: r.Swaps, PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens}
	}
	return out
}

// quotasToday is the day's use of every key with a quota.
func (a *Agent) quotasToday(now time.Time) []control.Quota {
	keys := a.gw.Load().APIKeys()
	if keys == nil {
		return nil
	}
	var out []control.Quota
	for _, s := range keys.Scopes() {
		if !s.Limited() {
			continue
		}
		h, tokens, end := a.usage.Today(s.Name, now)
		out = append(out, control.Quota{Key: s.Name, GPUHours: h, GPUHoursPerDay: s.GPUHoursPerDay,
			Tokens: tokens, TokensPerDay: s.TokensPerDay, Renews: end})
	}
	return out
}

// usageMetrics is the ledger's totals for the metrics.
func (a *Agent) usageMetrics() []metrics.KeyUsage {
	rows := a.usage.Total()
	out := make([]metrics.KeyUsage, len(rows))
	for i, r := range rows {
		out[i] = metrics.KeyUsage{Key: r.Key, Model: r.Model, ByteSeconds: r.ByteSeconds, Wakes: r.Wakes, Swaps: r.Swaps}
	}
	return out
}
