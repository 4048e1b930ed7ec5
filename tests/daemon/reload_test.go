package daemon

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// demo is a demo-engine model that sleeps by stopping and starts in 200ms.
func demo(name, extra string, flags ...string) string {
	return harness.DemoModel(name, `sleep = "stop"`+"\n"+extra, append([]string{"--startup-delay", "200ms"}, flags...)...)
}

// A SIGHUP with a valid config under load: requests for the models that
// stay never fail (the changed one's engine is restarted between its
// requests), the added model serves, and the removed one finishes the
// request it holds, then its engine is stopped and it answers 404.
func TestReload_ValidConfigUnderLoad(t *testing.T) {
	n := harness.Start(t, harness.Options{
		Models: demo("keep", "") + demo("change", "") + demo("gone", "", "--tokens-per-second", "20"),
	})
	ctx := context.Background()
	for _, m := range []string{"keep", "change", "gone"} {
		if r := post(ctx, n, m, harness.Chat(m, false, 2)); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("warm-up %v", r)
		}
	}
	goneEngine := enginePIDs(n)["gone"]
	changeEngine := enginePIDs(n)["change"]
	if len(goneEngine) != 1 || len(changeEngine) != 1 {
		t.Fatalf("engine pids %v", enginePIDs(n))
	}

	load := startLoad(n, "keep", "change")
	// A request for "gone" that holds its lease across the reload (60
	// tokens at 20/s: 3s, ample for a reload on a busy machine).
	held := make(chan result, 1)
	go func() { held <- post(ctx, n, "gone", harness.Chat("gone", false, 60)) }()
	n.WaitLeases("gone", 1, 10*time.Second)

	n.RewriteModels(demo("keep", "") + demo("change", "", "--ttft", "20ms") + demo("added", ""))
	n.Signal(syscall.SIGHUP)
	n.WaitLog("config reloaded", 5*time.Second)

	// The removed model's engine runs until its last lease ends.
	if !alive(goneEngine[0]) {
		t.Errorf("engine of the removed model stopped while a request held its lease")
	}
	if r := <-held; r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, "tok") {
		t.Errorf("request held by the removed model: %v", r)
	}
	waitGone(t, goneEngine[0], 10*time.Second)
	if r := post(ctx, n, "gone", harness.Chat("gone", false, 2)); r.status != http.StatusNotFound {
		t.Errorf("removed model after reload: %v, want 404", r)
	}
	if r := post(ctx, n, "added", harness.Chat("added", false, 2)); r.err != nil || r.status != http.StatusOK {
		t.Errorf("added model: %v", r)
	}

	// The changed engine is restarted with its new flags while the load
	// keeps running.
	deadline := time.Now().Add(10 * time.Second)
	for len(enginePIDs(n)["change"]) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if pids := enginePIDs(n)["change"]; len(pids) < 2 {
		t.Errorf("engine of the changed model was not restarted: pids %v", pids)
	}
	before := load.count("change")
	for load.count("change") < before+5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	results := load.stop()
	checkAllOK(t, results, "keep", "change")
	if strings.Contains(n.Log(), "config changes that take effect only at restart") {
		t.Errorf("a models-only reload warned about restart-only keys")
	}
}

// A SIGHUP with an invalid config under load is refused: the errors are
// logged with file:line, the running config keeps serving, no request
// fails, and the reload counter says invalid.
func TestReload_InvalidConfigUnderLoad(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: demo("keep", "")})
	load := startLoad(n, "keep")
	deadline := time.Now().Add(10 * time.Second)
	for load.count("keep") < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	n.RewriteModels(demo("keep", `idle_timeout = "soon"`) + demo("other", ""))
	n.Signal(syscall.SIGHUP)
	n.WaitLog("config reload refused", 5*time.Second)
	before := load.count("keep")
	for load.count("keep") < before+5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	checkAllOK(t, load.stop(), "keep")

	if !regexp.MustCompile(`napd\.toml:\d+: models\.keep\.idle_timeout`).MatchString(n.Log()) {
		t.Errorf("refused reload's log has no file:line: key error:\n%s", n.Log())
	}
	if r := post(context.Background(), n, "other", harness.Chat("other", false, 2)); r.status != http.StatusNotFound {
		t.Errorf("model of the refused config: %v, want 404", r)
	}
	fams := scrape(t, n)
	if v := value(sample(fams, "napd_config_reloads_total", map[string]string{"result": "invalid"})); v != 1 {
		t.Errorf("napd_config_reloads_total{result=invalid} = %v, want 1", v)
	}
}

// checkAllOK fails for every request of models that was not a 200.
func checkAllOK(t *testing.T, results []result, models ...string) {
	t.Helper()
	count := make(map[string]int)
	for _, r := range results {
		count[r.model]++
		if r.err != nil || r.status != http.StatusOK {
			t.Errorf("request failed under reload: %v", r)
		}
	}
	for _, m := range models {
		if count[m] == 0 {
			t.Errorf("no request for %s ran", m)
		}
	}
}

// A reload that passes the config parser but fails a later step (here the
// API keys file does not exist) is refused before it changes anything: the
// log level, the body limit and the keys (none) stay those of the running
// config, and the reload counter says invalid.
func TestReload_RefusedChangesNothing(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: demo("keep", ""), LogLevel: "info", Gateway: `max_body = "1MiB"`})
	ctx := context.Background()
	big := `{"model":"keep","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`
	if r := post(ctx, n, "keep", big); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("before the reload: %v", r)
	}
	b, err := os.ReadFile(n.Config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), `log_level = "info"`, `log_level = "debug"`, 1)
	cfg = strings.Replace(cfg, `max_body = "1MiB"`, `max_body = "1KiB"`+"\n"+
		`request_timeout = "1ms"`+"\n"+
		`api_keys_file = "`+filepath.Join(n.Dir, "no-such-keys")+`"`, 1)
	if cfg == string(b) {
		t.Fatal("config rewrite changed nothing")
	}
	if err := os.WriteFile(n.Config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	n.Signal(syscall.SIGHUP)
	n.WaitLog("config reload refused", 10*time.Second)
	mark := len(n.Log())

	// No key, a 4 KiB body, and the old timeout: all still accepted.
	if r := post(ctx, n, "keep", big); r.err != nil || r.status != http.StatusOK {
		t.Errorf("after the refused reload: %v", r)
	}
	if log := n.Log()[mark:]; strings.Contains(log, "level=DEBUG") {
		t.Errorf("the refused reload's debug level applied:\n%s", log)
	}
	fams := scrape(t, n)
	if v := value(sample(fams, "napd_config_reloads_total", map[string]string{"result": "invalid"})); v != 1 {
		t.Errorf("napd_config_reloads_total{result=invalid} = %v, want 1", v)
	}
}

// The keys of removed runtime knobs still load, with a warning in napd's
// log naming the file, the line and the key and saying what to set
// instead, at start and again at each reload.
func TestConfig_DeprecatedKeysWarnAtStartAndReload(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: demo("keep", ""), LogLevel: "info", Agent: "cpus = 2\nheap_floor = \"64MiB\""})
	warned := func(log string) int {
		count := 0
		for _, want := range []string{`key=agent.cpus`, `key=agent.heap_floor`} {
			for line := range strings.Lines(log) {
				if strings.Contains(line, `msg="config key ignored"`) && strings.Contains(line, want) &&
					strings.Contains(line, "file="+n.Config) && strings.Contains(line, "line=") && strings.Contains(line, "Environment=GO") {
					count++
				}
			}
		}
		return count
	}
	if got := warned(n.Log()); got != 2 {
		t.Fatalf("%d warnings at start, want one per key:\n%s", got, n.Log())
	}
	mark := len(n.Log())
	n.Signal(syscall.SIGHUP)
	n.WaitLog("config reloaded", 10*time.Second)
	if got := warned(n.Log()[mark:]); got != 2 {
		t.Errorf("%d warnings at reload, want one per key:\n%s", got, n.Log()[mark:])
	}
	if r := post(context.Background(), n, "keep", `{"model":"keep","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`); r.err != nil || r.status != http.StatusOK {
		t.Errorf("a request: %v", r)
	}
}
