// Package statuspage renders napd's read-only status page (GET /napd/ on
// the gateway): every model's state and reason, its leases and queue, its
// memory, its last wake, and a memory bar per GPU. It is one server-rendered
// HTML page with inline styles, no script and no external asset, that
// reloads itself. It reads a control.Status and changes nothing.
package statuspage

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/gpuvendor"
)

// Refresh is how often the page reloads itself.
const Refresh = 5 * time.Second

//go:embed page.html
var pageHTML string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"bytes": humanBytes,
}).Parse(pageHTML))

// Handler serves the page from status, read at each request; now reads the
// clock for ages (nil: time.Now).
func Handler(status func() control.Status, now func() time.Time, log *slog.Logger) http.Handler {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := page.Execute(&buf, view(status(), now())); err != nil {
			log.Error("status page", "err", err)
			http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		// Nothing outside the page may load or run; it needs no script.
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Length", strconv.Itoa(buf.Len()))
		_, _ = w.Write(buf.Bytes())
	})
}

// pageView is what the template shows.
type pageView struct {
	Refresh    int
	Now        string
	Version    string
	Supervisor string
	Config     string
	Uptime     string
	Host       string
	GPUs       []gpuView
	Models     []modelView
	Usage      []usageView
	Quotas     []quotaView
}

// usageView is one key's use of one model in the last 24 hours.
type usageView struct {
	Key, Model, GPUHours, GiBHours   string
	Wakes, Swaps, Prompt, Completion int64
}

// quotaView is a key's use today against its quotas.
type quotaView struct {
	Key, GPU, Tokens, Renews string
}

type gpuView struct {
	Label  string
	Vendor string // "amd", for the page's data attribute
	// VendorName is shown beside the label: "AMD".
	VendorName string
	Used       string
	Total      string
	Percent    int
	Segments   []segment // by model, then other processes
}

type segment struct {
	Label   string
	Percent float64
	Class   string
}

type modelView struct {
	Name     string
	Aliases  string
	State    string
	Reason   string
	Since    string
	Leases   int
	Queue    int
	Engine   string
	GPU      string
	LastWake string
	Idle     string
	// Load says a waking model's load progress ("" when not measured);
	// LoadPercent is its fraction of the weights read ("" when unknown).
	Load        string
	LoadPercent string
}

func view(st control.Status, now time.Time) pageView {
	v := pageView{
		Refresh: int(Refresh.Seconds()), Now: now.UTC().Format("2006-01-02 15:04:05 UTC"),
		Version: st.Version, Supervisor: st.Supervisor, Config: st.Config,
	}
	if !st.Started.IsZero() {
		v.Uptime = age(now.Sub(st.Started))
	}
	switch {
	case st.Host.TotalBytes > 0:
		v.Host = fmt.Sprintf("%s available of %s", humanBytes(st.Host.AvailableBytes), humanBytes(st.Host.TotalBytes))
	case st.Host.AvailableBytes > 0:
		v.Host = humanBytes(st.Host.AvailableBytes) + " available"
	default:
		v.Host = "not measured"
	}
	if st.Host.PSISomeAvg10 != nil {
		v.Host += fmt.Sprintf(", memory pressure %.1f%%", *st.Host.PSISomeAvg10)
	}
	for _, g := range st.GPUs {
		v.GPUs = append(v.GPUs, gpuOf(g, st.Models))
	}
	for _, m := range st.Models {
		v.Models = append(v.Models, modelOf(m, now))
	}
	for _, u := range st.Usage {
		key := u.Key
		if key == "" {
			key = "–"
		}
		v.Usage = append(v.Usage, usageView{Key: key, Model: u.Model, GPUHours: fmt.Sprintf("%.3f", u.GPUHours),
			GiBHours: fmt.Sprintf("%.1f", u.GPUByteSeconds/(1<<30)/3600), Wakes: u.Wakes, Swaps: u.Swaps,
			Prompt: u.PromptTokens, Completion: u.CompletionTokens})
	}
	for _, q := range st.Quotas {
		qv := quotaView{Key: q.Key, GPU: fmt.Sprintf("%.3f", q.GPUHours), Tokens: strconv.FormatInt(q.Tokens, 10),
			Renews: q.Renews.UTC().Format("2006-01-02 15:04 UTC")}
		if q.GPUHoursPerDay > 0 {
			qv.GPU += fmt.Sprintf(" of %g", q.GPUHoursPerDay)
		}
		if q.TokensPerDay > 0 {
			qv.Tokens += fmt.Sprintf(" of %d", q.TokensPerDay)
		}
		v.Quotas = append(v.Quotas, qv)
	}
	return v
}

// gpuOf is one device's bar: a segment per model holding memory there,
// then what other processes use.
func gpuOf(g control.GPUMemory, models []control.ModelStatus) gpuView {
	idx := strconv.Itoa(g.Index)
	gv := gpuView{Label: "GPU " + idx, Used: humanBytes(g.UsedBytes), Total: humanBytes(g.TotalBytes)}
	if g.Vendor != "" {
		gv.Vendor, gv.VendorName = g.Vendor, gpuvendor.Name(g.Vendor)
	}
	if g.Name != "" {
		gv.Label += " · " + g.Name
	}
	if g.TotalBytes <= 0 {
		return gv
	}
	pct := func(b int64) float64 { return 100 * float64(b) / float64(g.TotalBytes) }
	gv.Percent = int(pct(g.UsedBytes) + 0.5)
	var byModels int64
	for i, m := range models {
		if b := m.GPUBytes[idx]; b > 0 {
			byModels += b
			gv.Segments = append(gv.Segments, segment{
				Label: fmt.Sprintf("%s: %s", m.Name, humanBytes(b)), Percent: pct(b), Class: "c" + strconv.Itoa(i%6)})
		}
	}
	if other := g.UsedBytes - byModels; other > 0 {
		gv.Segments = append(gv.Segments, segment{
			Label: "other processes: " + humanBytes(other), Percent: pct(other), Class: "other"})
	}
	return gv
}

func modelOf(m control.ModelStatus, now time.Time) modelView {
	mv := modelView{Name: m.Name, State: m.State, Reason: m.Reason, Leases: m.Leases, Queue: m.QueueDepth,
		Engine: "–", GPU: "–", LastWake: "–", Idle: "–"}
	for i, a := range m.Aliases {
		if i > 0 {
			mv.Aliases += ", "
		}
		mv.Aliases += a
	}
	if !m.StateSince.IsZero() {
		mv.Since = age(now.Sub(m.StateSince))
	}
	if m.EngineBytes != nil {
		mv.Engine = humanBytes(*m.EngineBytes)
	}
	if len(m.GPUBytes) > 0 {
		gpus := make([]string, 0, len(m.GPUBytes))
		for g := range m.GPUBytes {
			gpus = append(gpus, g)
		}
		sort.Strings(gpus)
		mv.GPU = ""
		for i, g := range gpus {
			if i > 0 {
				mv.GPU += ", "
			}
			mv.GPU += fmt.Sprintf("GPU %s: %s", g, humanBytes(m.GPUBytes[g]))
		}
	}
	switch {
	case m.LastWakeMs >= 1000:
		mv.LastWake = fmt.Sprintf("%.1f s", float64(m.LastWakeMs)/1000)
	case m.LastWakeMs > 0:
		mv.LastWake = fmt.Sprintf("%d ms", m.LastWakeMs)
	}
	if m.IdleSince != nil {
		mv.Idle = age(now.Sub(*m.IdleSince))
	}
	if m.Load != nil {
		ls := m.Load.Status()
		mv.Load = ls.Text(m.Name)
		if ls.HaveFraction {
			mv.LoadPercent = fmt.Sprintf("%.0f", 100*ls.Fraction)
		}
	}
	return mv
}

// age is a short duration for people: "42s", "5m10s", "3h12m", "2d4h".
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// humanBytes is a size in binary units: "512 MiB", "79.6 GiB".
func humanBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	v := float64(b) / float64(div)
	suffix := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}[exp]
	if v >= 100 {
		return fmt.Sprintf("%.0f %s", v, suffix)
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}
