package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/sleepmode"
)

// minimal is a valid model body used where a test needs one.
const minimal = `command = ["engine", "--port", "${PORT}"]` + "\n"

func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	cfg, err := Parse("test.toml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

func problems(t *testing.T, src string) Errors {
	t.Helper()
	_, err := Parse("test.toml", []byte(src))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error = %v, want Errors", err)
	}
	return errs
}

func TestParse_EmptyFileIsDefaults(t *testing.T) {
	cfg := mustParse(t, "")
	want := Default()
	want.Path = "test.toml"
	want.shown = cfg.shown // what Show prints: TestShow
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}
}

// The keys of removed mechanisms (agent.cpus, agent.heap_floor) still
// load, for one release, with a warning naming file, line and key and
// saying what to do instead; whatever their value, nothing else changes.
func TestParse_DeprecatedKeysWarn(t *testing.T) {
	cfg := mustParse(t, "[agent]\nlog_level = \"debug\"\ncpus = 3\n\nheap_floor = \"64MiB\"\n")
	if cfg.Agent.LogLevel != "debug" {
		t.Errorf("log_level = %q: the table's other keys were lost", cfg.Agent.LogLevel)
	}
	want := []struct {
		line     int
		key, fix string
	}{{3, "agent.cpus", "Environment=GOMAXPROCS="}, {5, "agent.heap_floor", "Environment=GOGC="}}
	if len(cfg.Warnings) != len(want) {
		t.Fatalf("warnings %v, want %d", cfg.Warnings, len(want))
	}
	for i, w := range want {
		p := cfg.Warnings[i]
		if p.File != "test.toml" || p.Line != w.line || p.Key != w.key || !strings.Contains(p.Message, "deprecated") || !strings.Contains(p.Message, w.fix) {
			t.Errorf("warning %d = %q, want test.toml:%d: %s: deprecated … %s", i, p.String(), w.line, w.key, w.fix)
		}
	}
	for _, src := range []string{"[agent]\ncpus = -1\n", "[agent]\nheap_floor = 32\n"} {
		if cfg := mustParse(t, src); len(cfg.Warnings) != 1 {
			t.Errorf("%q: warnings %v, want one", src, cfg.Warnings)
		}
	}
	if cfg := mustParse(t, "[agent]\nlog_level = \"info\"\n"); cfg.Warnings != nil {
		t.Errorf("a file without deprecated keys warns: %v", cfg.Warnings)
	}
	if ps := problems(t, "[gateway]\ncpus = 2\n"); len(ps) != 1 || ps[0].Key != "gateway.cpus" || !strings.Contains(ps[0].Message, "unknown key") {
		t.Errorf("cpus outside [agent]: %v, want an unknown key", ps)
	}
}

func TestParse_GPUPlacement(t *testing.T) {
	cfg := mustParse(t, "[models.a]\n"+minimal+"gpus = \"any\"\n[models.b]\n"+minimal+"gpus = { count = 2 }\n[models.c]\n"+minimal+"gpus = [1]\n")
	for i, want := range []struct {
		gpus  []int
		count int
	}{{nil, 1}, {nil, 2}, {[]int{1}, 0}} {
		if m := cfg.Models[i]; !slices.Equal(m.GPUs, want.gpus) || m.GPUCount != want.count {
			t.Errorf("%s: gpus %v count %d, want %v %d", m.Name, m.GPUs, m.GPUCount, want.gpus, want.count)
		}
	}
}

func TestParse_Errors(t *testing.T) {
	// Each case is one error class; the problem must name the key and line.
	tests := []struct {
		name string
		src  string
		line int
		key  string
		msg  string
	}{
		{"unknown top-level key", "[agent]\n\n[agnet]\n", 3, "agnet", "unknown key"},
		{"unknown key", "[agent]\nstate_dir = \"/x\"\nstatedir = \"/y\"\n", 3, "agent.statedir", "unknown key"},
		{"unknown key with hint", "[policy]\nidle-timeout = \"1m\"\n", 2, "policy.idle-timeout", `did you mean "idle_timeout"`},
		{"unknown model key", "[models.a]\n" + minimal + "slep = \"stop\"\n", 3, "models.a.slep", "unknown key"},
		{"section not a table", "agent = 1\n", 1, "agent", "want a table, got integer"},
		{"wrong type string", "[agent]\nlog_level = 3\n", 2, "agent.log_level", "want a string, got integer"},
		{"wrong type int", "[policy]\nwake_attempts = \"3\"\n", 2, "policy.wake_attempts", "want an integer, got string"},
		{"wrong type bool", "[policy]\nallow_untracked_unload = \"yes\"\n", 2, "policy.allow_untracked_unload", "want a boolean"},
		{"wrong type float", "[pressure]\npsi_some_avg10 = true\n", 2, "pressure.psi_some_avg10", "want a number"},
		{"wrong type list", "[gateway]\nlisten = \"127.0.0.1:8080\"\n", 2, "gateway.listen", "want an array of strings, got string"},
		{"wrong type list element", "[models.a]\ncommand = [\"x\", 1]\n", 2, "models.a.command", "element 1: want a string, got integer"},
		{"wrong type env value", "[models.a]\n" + minimal + "environment = { A = 1 }\n", 3, "models.a.environment", "A: want a string"},
		{"bad env name", "[models.a]\n" + minimal + "environment = { \"A-B\" = \"1\" }\n", 3, "models.a.environment", "not a valid environment variable name"},
		{"bad size unit", "[gateway]\nmax_body = \"16MB\"\n", 2, "gateway.max_body", `unknown unit "MB"`},
		{"bad size number", "[pressure]\ngpu_reserve = \"lots\"\n", 2, "pressure.gpu_reserve", "bad size"},
		{"size missing unit", "[pressure]\nhost_reserve = \"2048\"\n", 2, "pressure.host_reserve", "missing unit"},
		{"size not a string", "[pressure]\nhost_reserve = 2048\n", 2, "pressure.host_reserve", "want a size string"},
		{"size zero where meaningless", "[gateway]\nmax_body = \"0\"\n", 2, "gateway.max_body", "must be greater than 0"},
		{"size too large", "[gateway]\nmax_body = \"99999999999TiB\"\n", 2, "gateway.max_body", "too large"},
		{"bad duration", "[gateway]\nrequest_timeout = \"10\"\n", 2, "gateway.request_timeout", "bad duration"},
		{"zero write timeout", "[gateway]\nwrite_timeout = \"0\"\n", 2, "gateway.write_timeout", "must be greater than 0"},
		{"zero max connections", "[gateway]\nmax_connections = 0\n", 2, "gateway.max_connections", "out of range"},
		{"deny rule without a slash", "[gateway]\nupstream_deny = [\"/ok\", \"sleep\"]\n", 2, "gateway.upstream_deny", "element 1"},
		{"allow rule with a lower-case method", "[gateway]\nupstream_allow = [\"get /is_sleeping\"]\n", 2, "gateway.upstream_allow", "upper case"},
		{"negative duration", "[policy]\ndrain_timeout = \"-1s\"\n", 2, "policy.drain_timeout", "must not be negative"},
		{"negative yield_after", "[policy]\nyield_after = \"-1s\"\n", 2, "policy.yield_after", "must not be negative"},
		{"wake_progress not a boolean", "[models.a]\n" + minimal + "wake_progress = 1\n", 3, "models.a.wake_progress", "want a boolean"},
		{"zero duration where meaningless", "[policy]\nwake_timeout = \"0\"\n", 2, "policy.wake_timeout", "must be greater than 0"},
		{"wake_stall_timeout not a duration", "[policy]\nwake_stall_timeout = 30\n", 2, "policy.wake_stall_timeout", "want a duration string"},
		{"duration not a string", "[policy]\nidle_timeout = 0\n", 2, "policy.idle_timeout", "want a duration string"},
		{"unknown supervisor", "[agent]\nsupervisor = \"k8s\"\n", 2, "agent.supervisor", `unknown value "k8s"`},
		{"unknown log level", "[agent]\nlog_level = \"trace\"\n", 2, "agent.log_level", `unknown value "trace"`},
		{"unknown arrival policy", "[policy]\narrival_while_draining = \"queue\"\n", 2, "policy.arrival_while_draining", `unknown value "queue"`},
		{"unknown sleep strategy", "[models.a]\n" + minimal + "sleep = \"hibernate\"\n", 3, "models.a.sleep", `unknown value "hibernate"`},
		{"unknown transport", "[models.a]\n" + minimal + "transport = \"grpc\"\n", 3, "models.a.transport", `unknown value "grpc"`},
		{"unknown model policy value", "[models.a]\n" + minimal + "arrival_while_draining = \"x\"\n", 3, "models.a.arrival_while_draining", "unknown value"},
		{"zero wake attempts", "[policy]\nwake_attempts = 0\n", 2, "policy.wake_attempts", "out of range"},
		{"negative queue", "[models.a]\n" + minimal + "queue = -1\n", 3, "models.a.queue", "out of range"},
		{"zero max_concurrency", "[models.a]\n" + minimal + "max_concurrency = 0\n", 3, "models.a.max_concurrency", "out of range"},
		{"port out of range", "[models.a]\n" + minimal + "port = 70000\n", 3, "models.a.port", "out of range"},
		{"zero gpu_memory", "[models.a]\n" + minimal + "gpu_memory = \"0\"\n", 3, "models.a.gpu_memory", "must be greater than 0"},
		{"psi out of range", "[pressure]\npsi_some_avg10 = 0.0\n", 2, "pressure.psi_some_avg10", "out of range"},
		{"negative gpu", "[models.a]\n" + minimal + "gpus = [0, -1]\n", 3, "models.a.gpus", "out of range"},
		{"gpu twice", "[models.a]\n" + minimal + "gpus = [1, 1]\n", 3, "models.a.gpus", "listed twice"},
		{"deep_sleep level", "[policy]\ndeep_sleep = \"vllm-l2\"\n", 2, "policy.deep_sleep", `"stop"`},
		{"deep_sleep_after", "[models.a]\n" + minimal + "deep_sleep_after = \"soon\"\n", 3, "models.a.deep_sleep_after", ""},
		{"keep_awake day", "[models.a]\n" + minimal + "keep_awake = [\"Mon..Fry 08:00..18:00\"]\n", 3, "models.a.keep_awake", `unknown day "Fry"`},
		{"keep_awake type", "[models.a]\n" + minimal + "keep_awake = \"Mon 08:00..09:00\"\n", 3, "models.a.keep_awake", "want an array of strings"},
		{"max_awake per model", "[models.a]\n" + minimal + "max_awake = 2\n", 3, "models.a.max_awake", "unknown key"},
		{"max_awake negative", "[policy]\nmax_awake = -1\n", 2, "policy.max_awake", "out of range"},
		{"priorities empty", "[policy]\npriorities = []\n", 2, "policy.priorities", "want 1 to 16"},
		{"priorities twice", "[policy]\npriorities = [\"a\", \"a\"]\n", 2, "policy.priorities", "listed twice"},
		{"priorities per model", "[models.a]\n" + minimal + "priorities = [\"a\"]\n", 3, "models.a.priorities", "unknown key"},
		{"priority_age zero", "[policy]\npriority_age = \"0\"\n", 2, "policy.priority_age", "greater than 0"},
		{"priority_yield_after class", "[policy]\npriority_yield_after = { bulk = \"5s\" }\n", 2, "policy.priority_yield_after", `unknown priority class "bulk"`},
		{"priority_yield_after value", "[policy]\npriority_yield_after = { batch = 5 }\n", 2, "policy.priority_yield_after", "batch: want a duration string"},
		{"model priority class", "[models.a]\n" + minimal + "priority = \"urgent\"\n", 3, "models.a.priority", "want one of interactive, default, batch"},
		{"model priority of own list", "[policy]\npriorities = [\"hi\", \"lo\"]\n[models.a]\n" + minimal + "priority = \"batch\"\n", 5, "models.a.priority", "want one of hi, lo"},
		{"engine_priority type", "[models.a]\n" + minimal + "engine_priority = \"yes\"\n", 3, "models.a.engine_priority", "want a boolean"},
		{"gpus word", "[models.a]\n" + minimal + "gpus = \"all\"\n", 3, "models.a.gpus", `"any" or { count = N }`},
		{"gpus count zero", "[models.a]\n" + minimal + "gpus = { count = 0 }\n", 3, "models.a.gpus", "out of range"},
		{"gpus count type", "[models.a]\n" + minimal + "gpus = { count = \"2\" }\n", 3, "models.a.gpus", "want an integer"},
		{"gpus table key", "[models.a]\n" + minimal + "gpus = { cnt = 2 }\n", 3, "models.a.gpus", `unknown key "cnt"`},
		{"gpus any with unit", "[models.a]\nunit = \"a.service\"\nport = 1\ngpus = \"any\"\n", 4, "models.a.gpus", "cannot choose the GPUs"},
		{"relative path", "[agent]\nstate_dir = \"var/lib/napd\"\n", 2, "agent.state_dir", "not an absolute path"},
		{"bad listen", "[agent]\nmetrics_listen = \"9464\"\n", 2, "agent.metrics_listen", "want HOST:PORT"},
		{"bad agent check listen", "[agent]\nhaproxy_agent_listen = \"host\"\n", 2, "agent.haproxy_agent_listen", "want HOST:PORT"},
		{"bad events address", "[agent]\nevents_address = \"/run/x.sock\"\n", 2, "agent.events_address", "bad ZeroMQ address"},
		{"bad health path", "[models.a]\n" + minimal + "health = \"health\"\n", 3, "models.a.health", "starting with /"},
		{"bad unit name", "[models.a]\nunit = \"vllm\"\nport = 1\n", 2, "models.a.unit", "not a systemd service name"},
		{"wrong type unit alone", "[models.a]\nunit = 3\n", 2, "models.a.unit", "want a string, got integer"},
		{"inline model", "models = { a = { unit = \"a.service\", sleep = \"x\", port = 1 } }\n", 1, "models.a.sleep", "unknown value"},
		{"command and unit", "[models.a]\n" + minimal + "unit = \"a.service\"\n", 3, "models.a.unit", "both set"},
		{"neither command nor unit", "\n[models.a]\nport = 8000\n", 2, "models.a", "neither command nor unit"},
		{"empty command", "[models.a]\ncommand = []\nport = 1\n", 2, "models.a.command", "must not be empty"},
		{"empty program", "[models.a]\ncommand = [\"\"]\nport = 1\n", 2, "models.a.command", "first element"},
		{"unit without port", "[models.a]\nunit = \"a.service\"\n", 2, "models.a.port", "set port"},
		{"port 0 without ${PORT}", "[models.a]\ncommand = [\"engine\"]\n", 2, "models.a.command", "${PORT}"},
		{"zmq without address", "[models.a]\ntransport = \"zmq\"\ncommand = [\"w\"]\n", 1, "models.a", "needs address"},
		{"address on http", "[models.a]\n" + minimal + "address = \"ipc:///x\"\n", 3, "models.a.address", "only used with"},
		{"zmq with vllm sleep", "[models.a]\ntransport = \"zmq\"\ncommand = [\"w\"]\naddress = \"ipc:///x\"\nsleep = \"vllm-l1\"\n", 5, "models.a.sleep", `a transport = "zmq" worker sleeps by "stop" or "none"`},
		{"bad zmq address", "[models.a]\ntransport = \"zmq\"\ncommand = [\"w\"]\naddress = \"x\"\n", 4, "models.a.address", "bad ZeroMQ address"},
		{"unsafe model name", "[models.Qwen3]\n" + minimal, 1, "models.Qwen3", "not allowed"},
		{"model name with slash", "[models.\"a/b\"]\n" + minimal, 1, `models."a/b"`, "not allowed"},
		{"model name too long", "[models." + strings.Repeat("a", 65) + "]\n" + minimal, 1, "models." + strings.Repeat("a", 65), "at most 64"},
		{"model not a table", "[models]\na = 1\n", 2, "models.a", "want a table"},
		{"duplicate alias", "[models.a]\n" + minimal + "aliases = [\"x\"]\n[models.b]\n" + minimal + "aliases = [\"x\"]\n", 6, "models.b.aliases", `alias "x" is already an alias of model a`},
		{"alias listed twice", "[models.a]\n" + minimal + "aliases = [\"x\", \"x\"]\n", 3, "models.a.aliases", "listed twice"},
		{"alias clashes with model", "[models.a]\n" + minimal + "aliases = [\"b\"]\n[models.b]\n" + minimal, 3, "models.a.aliases", `alias "b" is the name of model b`},
		{"alias with space", "[models.a]\n" + minimal + "aliases = [\"my model\"]\n", 3, "models.a.aliases", "space"},
		{"two models on one port", "[models.a]\n" + minimal + "port = 8101\n[models.b]\n" + minimal + "port = 8101\n", 6, "models.b.port", "port 8101 is already used by model a"},
		{"listen clash with gateway", "[models.a]\n" + minimal + "listen = \"127.0.0.1:8080\"\n", 3, "models.a.listen", "collides with gateway.listen 127.0.0.1:8080"},
		{"listen clash by localhost", "[models.a]\n" + minimal + "listen = \"localhost:8080\"\n", 3, "models.a.listen", "localhost:8080 collides with gateway.listen 127.0.0.1:8080"},
		{"listen clash by wildcard", "[gateway]\nlisten = [\"0.0.0.0:9000\", \"[::1]:9000\"]\n", 2, "gateway.listen", "[::1]:9000 collides with gateway.listen 0.0.0.0:9000"},
		{"metrics on the gateway", "[agent]\nmetrics_listen = \"127.0.0.1:8080\"\n", 2, "agent.metrics_listen", "collides with gateway.listen 127.0.0.1:8080"},
		{"two model sockets", "[models.a]\n" + minimal + "listen = \"127.0.0.1:8201\"\n[models.b]\n" + minimal + "listen = \"localhost:8201\"\n", 6, "models.b.listen", "collides with models.a.listen"},
		{"control socket path too long", "[agent]\ncontrol_socket = \"/" + strings.Repeat("x", 120) + "\"\n", 2, "agent.control_socket", "longer than"},
		{"model port is the gateway's", "[models.a]\n" + minimal + "port = 8080\n", 3, "models.a.port", "port 8080 is napd's own: gateway.listen (127.0.0.1:8080) listens on it"},
		{"model port is the agent check's", "[agent]\nhaproxy_agent_listen = \"0.0.0.0:9500\"\n[models.a]\n" + minimal + "port = 9500\n", 5, "models.a.port", "agent.haproxy_agent_listen (0.0.0.0:9500)"},
		{"model port is the metrics'", "[models.a]\n" + minimal + "port = 9464\n", 3, "models.a.port", "agent.metrics_listen (127.0.0.1:9464)"},
		{"model port is another model's listen", "[models.a]\n" + minimal + "port = 8200\n[models.b]\n" + minimal + "listen = \"0.0.0.0:8200\"\n", 3, "models.a.port", "the listen of model b (0.0.0.0:8200)"},
		{"unknown evidence", "[models.a]\n" + minimal + "evidence = \"vibes\"\n", 3, "models.a.evidence", `unknown value "vibes"`},
		{"zmq with evidence", "[models.a]\ntransport = \"zmq\"\ncommand = [\"w\"]\naddress = \"ipc:///x\"\nevidence = \"connections\"\n", 5, "models.a.evidence", "reports its own activity"},
		{"activity metrics without metrics", "[models.a]\n" + minimal + "evidence = \"connections\"\nactivity_metrics = [\"x\"]\n", 4, "models.a.activity_metrics", `not "connections"`},
		{"bad metric name", "[models.a]\n" + minimal + "activity_metrics = [\"my-engine active\"]\n", 3, "models.a.activity_metrics", "bad metric name"},
		{"zero health failures", "[policy]\nhealth_failures = 0\n", 2, "policy.health_failures", "out of range"},
		{"negative health interval", "[models.a]\n" + minimal + "health_interval = \"-1s\"\n", 3, "models.a.health_interval", "must not be negative"},
		{"bad user", "[models.a]\n" + minimal + "user = \"a b\"\n", 3, "models.a.user", "not a user name"},
		{"route without method", "[gateway]\nroutes = [\"/completion\"]\n", 2, "gateway.routes", `element 0: route "/completion": want "POST /path"`},
		{"route with other method", "[gateway]\nroutes = [\"DELETE /slots\"]\n", 2, "gateway.routes", "want \"POST /path\""},
		{"route on napd's path", "[gateway]\nroutes = [\"POST /v1/x\"]\n", 2, "gateway.routes", "one of napd's own paths"},
		{"route on health", "[gateway]\nroutes = [\"GET /health\"]\n", 2, "gateway.routes", "one of napd's own paths"},
		{"route on the admin API", "[gateway]\nroutes = [\"GET /napd/v1/status\"]\n", 2, "gateway.routes", "one of napd's own paths"},
		{"route on the router API", "[gateway]\nroutes = [\"POST /models/load\"]\n", 2, "gateway.routes", "one of napd's own paths"},
		{"route with query", "[gateway]\nroutes = [\"GET /props?x=1\"]\n", 2, "gateway.routes", "must start with /"},
		{"route twice", "[gateway]\nroutes = [\"POST /a\", \"GET /a\"]\n", 2, "gateway.routes", "element 1: path /a is already routed by element 0"},
		{"cors origin with path", "[gateway]\ncors_origins = [\"https://a.example/app\"]\n", 2, "gateway.cors_origins", "bad origin"},
		{"cors origin not canonical", "[gateway]\ncors_origins = [\"https://A.example/\"]\n", 2, "gateway.cors_origins", `write it as browsers send it: "https://a.example"`},
		{"cors origin without scheme", "[gateway]\ncors_origins = [\"a.example\"]\n", 2, "gateway.cors_origins", "bad origin"},
		{"list_aliases not a bool", "[gateway]\nlist_aliases = \"no\"\n", 2, "gateway.list_aliases", "want a boolean"},
		{"empty served name", "[models.a]\n" + minimal + "served_name = \"\"\n", 3, "models.a.served_name", "must be non-empty"},
		{"syntax error", "[agent]\nsupervisor = \"auto\n", 2, "", ""},
		{"duplicate key", "[agent]\nlog_level = \"info\"\nlog_level = \"debug\"\n", 3, "", "already been defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := problems(t, tt.src)
			if len(errs) != 1 {
				t.Fatalf("got %d problems, want 1:\n%v", len(errs), errs)
			}
			p := errs[0]
			if p.File != "test.toml" || p.Line != tt.line || p.Key != tt.key || !strings.Contains(p.Message, tt.msg) {
				t.Errorf("got %q (line %d, key %q)\nwant line %d, key %q, message containing %q", p.String(), p.Line, p.Key, tt.line, tt.key, tt.msg)
			}
		})
	}
}

func TestParse_GatewayBreadth(t *testing.T) {
	cfg := mustParse(t, `
[gateway]
routes = ["POST /completion", "GET /props", "POST /v2/generate"]
list_aliases = false
cors_origins = ["https://chat.example", "http://localhost:3000", "*"]
`)
	g := cfg.Gateway
	want := []Route{{"POST", "/completion"}, {"GET", "/props"}, {"POST", "/v2/generate"}}
	if !reflect.DeepEqual(g.Routes, want) || g.ListAliases ||
		!reflect.DeepEqual(g.CORSOrigins, []string{"https://chat.example", "http://localhost:3000", "*"}) {
		t.Errorf("gateway %+v", g)
	}
	if d := Default().Gateway; !d.ListAliases || len(d.CORSOrigins) != 0 || len(d.Routes) != 7 {
		t.Errorf("defaults %+v", d)
	}
	if g := mustParse(t, "[gateway]\nroutes = []\n").Gateway; len(g.Routes) != 0 {
		t.Errorf("routes = [] kept %v", g.Routes)
	}
}

func TestParse_PortZeroExcepted(t *testing.T) {
	cfg := mustParse(t, "[models.a]\n"+minimal+"[models.b]\n"+minimal)
	if cfg.Models[0].Port != 0 || cfg.Models[1].Port != 0 {
		t.Errorf("ports = %d, %d; want 0, 0", cfg.Models[0].Port, cfg.Models[1].Port)
	}
}

func TestParse_AllErrorsAtOnce(t *testing.T) {
	src := `[agent]
supervisor = "k8s"
log_level = 3

[models.b]
command = ["y"]
port = 8000
sleep = "hibernate"

[models.a]
unit = "a.service"
port = 8000
`
	errs := problems(t, src)
	want := []string{
		`test.toml:2: agent.supervisor: unknown value "k8s" (want "auto", "systemd", "exec")`,
		`test.toml:3: agent.log_level: want a string, got integer`,
		`test.toml:8: models.b.sleep: unknown value "hibernate" (want "stop", "vllm-l1", "vllm-l2", "sglang", "llamacpp", "none")`,
		`test.toml:12: models.a.port: port 8000 is already used by model b`,
	}
	if got := strings.Split(errs.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("Error() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestParse_ModelValuesAndPolicyFallback(t *testing.T) {
	cfg := mustParse(t, `
[policy]
idle_timeout = "5m"
drain_timeout = "20s"
arrival_while_draining = "refuse"
wake_attempts = 2
wake_timeout = "1m"
wake_stall_timeout = "2m"
allow_untracked_unload = true
health_interval = "30s"
yield_after = "10s"

[models.zeta]
command = ["vllm", "serve", "--port", "${PORT}"]
port = 8101
aliases = ["default", "Qwen/Qwen3-8B"]
health = "/healthz"
sleep = "vllm-l1"
idle_timeout = "0"
wake_attempts = 5
gpus = [0, 1]
gpu_memory = "1.5GiB"
max_concurrency = 4
queue = 0
pinned = true
environment = { VLLM_SERVER_DEV_MODE = "1" }
listen = "127.0.0.1:18101"
served_name = "Qwen/Qwen3-8B-AWQ"
working_directory = "/srv"
user = "napd"
stop_timeout = "5s"
evidence = "metrics"
activity_metrics = ["myengine:active", "queue_depth"]
health_failures = 5
yield_after = "0"
wake_progress = true
wake_stall_timeout = "45s"
deep_sleep = "stop"
deep_sleep_after = "30m"
priority = "batch"
engine_priority = true

[models.alpha]
unit = "alpha.service"
port = 8102
`)
	if len(cfg.Models) != 2 || cfg.Models[0].Name != "zeta" || cfg.Models[1].Name != "alpha" {
		t.Fatalf("models not in file order: %+v", cfg.Models)
	}
	want := &Model{
		Name: "zeta", Command: []string{"vllm", "serve", "--port", "${PORT}"}, Port: 8101,
		Aliases: []string{"default", "Qwen/Qwen3-8B"}, Health: "/healthz", Sleep: sleepmode.VLLML1,
		GPUs: []int{0, 1}, GPUMemory: 3 << 29, MaxConcurrency: 4, Queue: 0, Pinned: true,
		Environment: map[string]string{"VLLM_SERVER_DEV_MODE": "1"}, Listen: "127.0.0.1:18101", ServedName: "Qwen/Qwen3-8B-AWQ",
		Transport: TransportHTTP, WorkingDirectory: "/srv", User: "napd", StopTimeout: 5 * time.Second,
		IdleTimeout: 0, DrainTimeout: 20 * time.Second, ArrivalWhileDraining: lifecycle.ArrivalRefuse,
		WakeAttempts: 5, WakeTimeout: time.Minute, WakeStallTimeout: 45 * time.Second, AllowUntrackedUnload: true,
		Evidence: EvidenceMetrics, ActivityMetrics: []string{"myengine:active", "queue_depth"},
		HealthInterval: 30 * time.Second, HealthFailures: 5, YieldAfter: 0, WakeProgress: true, Listed: true,
		DeepSleep: sleepmode.Stop, DeepSleepAfter: 30 * time.Minute,
		Priority: 3, EnginePriority: true, PriorityAge: time.Minute,
		APIKeyHeader: DefaultAPIKeyHeader, OverflowWhen: OverflowLate,
	}
	if !reflect.DeepEqual(cfg.Models[0], want) {
		t.Errorf("zeta =\n%+v\nwant\n%+v", cfg.Models[0], want)
	}
	alpha := cfg.Models[1]
	if alpha.IdleTimeout != 5*time.Minute || alpha.WakeAttempts != 2 || alpha.Health != DefaultHealth ||
		alpha.Sleep != sleepmode.Stop || alpha.MaxConcurrency != DefaultMaxConcurrency || alpha.Queue != DefaultQueue ||
		alpha.StopTimeout != DefaultStopTimeout || alpha.Transport != TransportHTTP ||
		alpha.Evidence != EvidenceAuto || alpha.HealthInterval != 30*time.Second || alpha.HealthFailures != 3 ||
		alpha.YieldAfter != 10*time.Second || alpha.WakeProgress || alpha.WakeStallTimeout != 2*time.Minute {
		t.Errorf("alpha did not get the defaults: %+v", alpha)
	}
}

func TestParse_PolicyAfterModelsStillApplies(t *testing.T) {
	// [policy] written after the models still sets their defaults.
	cfg := mustParse(t, "[models.a]\n"+minimal+"\n[policy]\nidle_timeout = \"1m\"\n")
	if got := cfg.Models[0].IdleTimeout; got != time.Minute {
		t.Errorf("IdleTimeout = %v, want 1m", got)
	}
}

func TestParse_ZMQModel(t *testing.T) {
	cfg := mustParse(t, `[models.w]
transport = "zmq"
address = "ipc:///run/napd/w.sock"
command = ["/opt/w", "--bind", "ipc:///run/napd/w.sock"]
[models.v]
transport = "zmq"
address = "tcp://127.0.0.1:5555"
unit = "v.service"
`)
	if m := cfg.Models[0]; m.Transport != TransportZMQ || m.Address != "ipc:///run/napd/w.sock" {
		t.Errorf("got %+v", m)
	}
}

func TestProblem_StringWithoutLine(t *testing.T) {
	p := Problem{File: "f.toml", Key: "agent", Message: "bad"}
	if got := p.String(); got != "f.toml: agent: bad" {
		t.Errorf("got %q", got)
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"24GiB", 24 << 30, true},
		{"512MiB", 512 << 20, true},
		{"1.5GiB", 3 << 29, true},
		{"0.5KiB", 512, true},
		{"1.0001B", 1, true},
		{"100B", 100, true},
		{"2 TiB", 2 << 40, true},
		{"0", 0, true},
		{"0.0", 0, true},
		{"", 0, false},
		{"GiB", 0, false},
		{"1GB", 0, false},
		{"-1GiB", 0, false},
		{"1e3MiB", 0, false},
		{"12", 0, false},
		{"8388608TiB", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestModel_ExpandPort(t *testing.T) {
	m := &Model{
		Command:     []string{"engine", "--port", "${PORT}", "--url=http://h:${PORT}/", "${HOME}"},
		Environment: map[string]string{"PORT": "${PORT}", "OTHER": "x"},
	}
	cmd, env := m.ExpandPort(8101)
	if want := []string{"engine", "--port", "8101", "--url=http://h:8101/", "${HOME}"}; !reflect.DeepEqual(cmd, want) {
		t.Errorf("command = %q, want %q", cmd, want)
	}
	if want := map[string]string{"PORT": "8101", "OTHER": "x"}; !reflect.DeepEqual(env, want) {
		t.Errorf("env = %v, want %v", env, want)
	}
	if m.Command[2] != "${PORT}" || m.Environment["PORT"] != "${PORT}" {
		t.Error("ExpandPort changed the model")
	}
	if cmd, env := (&Model{Unit: "u.service"}).ExpandPort(1); cmd != nil || env != nil {
		t.Errorf("unit model: got %q, %v; want nil, nil", cmd, env)
	}
}

func TestFreePort(t *testing.T) {
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if p <= 0 || p > 65535 {
		t.Errorf("FreePort = %d", p)
	}
}

func TestLoad_ShippedFiles(t *testing.T) {
	for _, tt := range []struct {
		file   string
		models int
	}{
		{"napd.toml", 0},
		{"demo.toml", 3},
	} {
		path := filepath.Join("..", "..", "etc", "napd", tt.file)
		cfg, err := Load(path)
		if err != nil {
			t.Fatalf("%s: %v", tt.file, err)
		}
		if len(cfg.Models) != tt.models {
			t.Errorf("%s: %d models, want %d", tt.file, len(cfg.Models), tt.models)
		}
		if tt.file == "napd.toml" {
			// The shipped file shows every default value.
			want := Default()
			want.Path = path
			want.shown = cfg.shown
			if !reflect.DeepEqual(cfg, want) {
				t.Errorf("napd.toml differs from the defaults:\n%+v\nwant\n%+v", cfg, want)
			}
		}
	}
}

func TestLoad_ShippedExamplesAreValid(t *testing.T) {
	// The commented-out models in napd.toml must be valid when uncommented.
	withRuntimes(t, "podman") // the container example's runtime
	data, err := os.ReadFile(filepath.Join("..", "..", "etc", "napd", "napd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	inModels := false
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "#[models.") {
			inModels = true
		}
		// "#key = …" is a commented setting; "# …" and "## …" are prose.
		if inModels && len(line) > 1 && line[0] == '#' && line[1] != ' ' && line[1] != '#' {
			line = line[1:]
		}
		b.WriteString(line)
	}
	cfg, err := Parse("napd.toml (uncommented)", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Models) != 6 {
		t.Errorf("%d example models, want 6", len(cfg.Models))
	}
}

func TestLoad_MissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "none.toml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want ErrNotExist", err)
	}
}

// The demo runs from a checkout, usually with /tmp for its files: they must
// sit in a directory napd creates for itself (and refuses when another user
// made it first), never directly in a world-writable one.
func TestLoad_DemoKeepsItsFilesInADirectoryOfItsOwn(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "..", "etc", "napd", "demo.toml"))
	if err != nil {
		t.Fatal(err)
	}
	shared := []string{"/tmp", "/var/tmp", "/dev/shm", "/run"}
	for key, dir := range map[string]string{"state_dir": cfg.Agent.StateDir, "control_socket's directory": filepath.Dir(cfg.Agent.ControlSocket)} {
		if slices.Contains(shared, filepath.Dir(dir)) || slices.Contains(shared, dir) {
			t.Errorf("demo %s %s is directly in a shared directory", key, dir)
		}
		if !strings.HasPrefix(dir, "/tmp/napd-demo/") && dir != "/tmp/napd-demo" {
			t.Errorf("demo %s %s is outside napd's own /tmp/napd-demo", key, dir)
		}
	}
}

// fair_share "auto" is on exactly when API keys are configured; "on" and
// "off" say so, in [policy] or per model.
func TestParse_FairShare(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      map[string]bool
	}{
		{"auto without keys", "[models.a]\n" + minimal, map[string]bool{"a": false}},
		{"auto with keys", "[gateway]\napi_keys_file = \"/etc/napd/keys\"\n[models.a]\n" + minimal, map[string]bool{"a": true}},
		{"off with keys, one model on", "[gateway]\napi_keys_file = \"/etc/napd/keys\"\n[policy]\nfair_share = \"off\"\n[models.a]\n" + minimal +
			"[models.b]\n" + minimal + "fair_share = \"on\"\n", map[string]bool{"a": false, "b": true}},
	} {
		cfg, err := Parse("napd.toml", []byte(c.doc))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, m := range cfg.Models {
			if m.FairShare != c.want[m.Name] {
				t.Errorf("%s: model %s FairShare = %v, want %v", c.name, m.Name, m.FairShare, c.want[m.Name])
			}
		}
	}
	if _, err := Parse("napd.toml", []byte("[policy]\nfair_share = true\n")); err == nil || !strings.Contains(err.Error(), "policy.fair_share") {
		t.Errorf("fair_share = true: %v", err)
	}
}

// listed = false hides a model from the gateway's lists, on a local model
// and a remote one alike; every model is listed by default.
func TestParse_Listed(t *testing.T) {
	cfg := mustParse(t, "[models.a]\n"+minimal+"[models.b]\n"+minimal+"listed = false\n"+
		"[models.c]\nurl = \"https://api.example/v1\"\nlisted = false\n")
	if !cfg.Models[0].Listed || cfg.Models[1].Listed || cfg.Models[2].Listed {
		t.Errorf("listed: a %v, b %v, c %v; want true, false, false", cfg.Models[0].Listed, cfg.Models[1].Listed, cfg.Models[2].Listed)
	}
}
