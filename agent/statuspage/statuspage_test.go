package statuspage

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
)

func TestPage_ShowsModelsGPUsAndMemory(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	engine := int64(3 << 30)
	psi := 2.5
	idle := now.Add(-90 * time.Second)
	frac, left := 0.4375, int64(12_000)
	st := control.Status{
		Version: "1.2.3", Supervisor: "systemd", Config: "/etc/napd/napd.toml", Started: now.Add(-3 * time.Hour),
		Host: control.HostMemory{TotalBytes: 64 << 30, AvailableBytes: 40 << 30, PSISomeAvg10: &psi},
		GPUs: []control.GPUMemory{{Index: 0, Name: "NVIDIA H100", TotalBytes: 80 << 30, UsedBytes: 60 << 30},
			{Index: 1, Vendor: "amd", Name: "AMD Instinct MI300X", TotalBytes: 192 << 30, UsedBytes: 0}},
		Models: []control.ModelStatus{
			{Name: "llama", Aliases: []string{"fast", "default"}, State: "awake", StateSince: now.Add(-5 * time.Minute),
				Leases: 3, QueueDepth: 2, EngineBytes: &engine, GPUBytes: map[string]int64{"0": 40 << 30}, LastWakeMs: 12345},
			{Name: "qwen", State: "failed", Reason: `exit status 1 <b>after</b> 3 attempts`, IdleSince: &idle},
			{Name: "big", State: "waking", Load: &control.LoadProgress{ReadBytes: 7 << 30, WeightBytes: 16 << 30, Progress: &frac, LeftMs: &left}},
		},
		Usage: []control.UsageRow{{Key: "nightly", Model: "llama", GPUByteSeconds: 40 << 30 * 1800, GPUHours: 0.25, Wakes: 2, Swaps: 1,
			PromptTokens: 1200, CompletionTokens: 340}},
		Quotas: []control.Quota{{Key: "nightly", GPUHours: 0.25, GPUHoursPerDay: 2, Tokens: 1540, Renews: now.Add(21 * time.Hour)}},
	}
	srv := httptest.NewServer(Handler(func() control.Status { return st }, func() time.Time { return now }, nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
	for _, want := range []string{
		`<meta http-equiv="refresh" content="5">`,
		`data-model="llama" data-state="awake"`, `data-model="qwen" data-state="failed"`,
		`aliases: fast, default`, `for 5m00s`, `<td class="n">3</td>`, `<td class="n">2</td>`,
		`3.0 GiB`, `GPU 0: 40.0 GiB`, `12.3 s`, `1m30s`,
		`exit status 1 &lt;b&gt;after&lt;/b&gt; 3 attempts`, // escaped
		`GPU 0 · NVIDIA H100`, `60.0 GiB used of 80.0 GiB (75%)`,
		`data-vendor="amd">`, `GPU 1 · AMD Instinct MI300X</strong> <span class="meta">AMD</span>`,
		`style="width:50.00%" title="llama: 40.0 GiB"`, `style="width:25.00%" title="other processes: 20.0 GiB"`,
		`40.0 GiB available of 64.0 GiB, memory pressure 2.5%`, `up 3h00m`, `version 1.2.3`,
		`data-key="nightly" data-model="llama"`, `<td class="n">0.250</td><td class="n">20.0</td>`, `<td class="n">1200</td><td class="n">340</td>`,
		`<td>0.250 of 2</td><td>1540</td><td>2026-12-02 00:00 UTC</td>`,
		`<progress max="100" value="44"></progress> big loading 43 % (7.0 of 16.0 GiB), about 12 s left`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://", "ZgotmplZ", "<b>after"} {
		if strings.Contains(body, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
}

func TestPage_NoGPUsNoModels(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler(func() control.Status { return control.Status{} }, nil, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/napd/", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "No GPU found") || !strings.Contains(rec.Body.String(), "No models configured") {
		t.Errorf("%d %s", rec.Code, rec.Body.String())
	}
}

func TestHumanBytesAndAge(t *testing.T) {
	for b, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 80 << 30: "80.0 GiB", 141 << 30: "141 GiB", 3 << 40: "3.0 TiB"} {
		if got := humanBytes(b); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", b, got, want)
		}
	}
	for d, want := range map[time.Duration]string{-time.Second: "0s", 42 * time.Second: "42s", 310 * time.Second: "5m10s", 3*time.Hour + 12*time.Minute: "3h12m", 52 * time.Hour: "2d4h"} {
		if got := age(d); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
}
