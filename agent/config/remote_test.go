package config

import (
	"slices"
	"strings"
	"testing"
)

const localB = "[models.b]\ncommand = [\"engine\", \"--port\", \"${PORT}\"]\n"

func TestParse_RemoteModelAndOverflow(t *testing.T) {
	cfg := mustParse(t, `
[models.cloud]
url = "https://api.example.com/v1"
api_key_file = "/etc/napd/cloud.key"
api_key_header = "x-api-key"
tls_ca_file = "/etc/napd/ca.pem"
served_name = "Qwen/Qwen3-8B"
aliases = ["qwen-cloud"]
max_concurrency = 4
queue = 8
health_interval = "30s"

[models.box2]
url = "http://10.0.0.2:8080"

`+localB+`overflow = ["box2", "cloud"]
overflow_when = "refused"
`)
	cloud, box2, b := cfg.Models[0], cfg.Models[1], cfg.Models[2]
	if !cloud.Remote() || cloud.URL != "https://api.example.com/v1" || cloud.APIKeyFile != "/etc/napd/cloud.key" ||
		cloud.APIKeyHeader != "x-api-key" || cloud.TLSCAFile != "/etc/napd/ca.pem" || cloud.Health != DefaultRemoteHealth ||
		cloud.MaxConcurrency != 4 || cloud.Queue != 8 || cloud.HealthInterval.String() != "30s" {
		t.Errorf("cloud: %+v", cloud)
	}
	if !box2.Remote() || box2.APIKeyHeader != DefaultAPIKeyHeader || box2.Health != "/v1/models" || box2.Command != nil {
		t.Errorf("box2: %+v", box2)
	}
	if b.Remote() || !slices.Equal(b.Overflow, []string{"box2", "cloud"}) || b.OverflowWhen != OverflowRefused || b.Health != DefaultHealth {
		t.Errorf("b: %+v", b)
	}
	if got := mustParse(t, localB+"overflow = [\"c\"]\n[models.c]\nurl = \"http://h\"\n").Models[0].OverflowWhen; got != OverflowLate {
		t.Errorf("overflow_when defaults to %q, want late", got)
	}
	if got := mustParse(t, "[models.c]\nurl = \"http://h\"\nhealth = \"/health\"\n").Models[0].Health; got != "/health" {
		t.Errorf("a remote's own health path: %q", got)
	}
}

// Every bad remote or overflow setting is one error naming the key and
// its line.
func TestParse_RemoteErrors(t *testing.T) {
	remote := "[models.r]\nurl = \"https://h/v1\"\n"
	for _, c := range []struct {
		name, body, key, msg string
	}{
		{"ftp url", "[models.r]\nurl = \"ftp://h/v1\"\n", "models.r.url", "want http:// or https://"},
		{"url without host", "[models.r]\nurl = \"https:///v1\"\n", "models.r.url", "no host"},
		{"url with credentials", "[models.r]\nurl = \"https://u:secret@h/v1\"\n", "models.r.url", "api_key_file"},
		{"url with a query", "[models.r]\nurl = \"https://h/v1?key=x\"\n", "models.r.url", "no query"},
		{"remote with command", remote + "command = [\"x\"]\n", "models.r.command", "runs no engine here"},
		{"remote with sleep", remote + "sleep = \"none\"\n", "models.r.sleep", "runs no engine here"},
		{"remote with gpus", remote + "gpus = [0]\n", "models.r.gpus", "runs no engine here"},
		{"remote with its own idle_timeout", remote + "idle_timeout = \"1m\"\n", "models.r.idle_timeout", "runs no engine here"},
		{"remote with overflow", remote + "overflow = []\n", "models.r.overflow", "runs no engine here"},
		{"relative api_key_file", remote + "api_key_file = \"key\"\n", "models.r.api_key_file", "not an absolute path"},
		{"header without a file", remote + "api_key_header = \"x-api-key\"\n", "models.r.api_key_header", "only used with api_key_file"},
		{"Host as the header", remote + "api_key_file = \"/k\"\napi_key_header = \"Host\"\n", "models.r.api_key_header", "frames or routes"},
		{"a header with a space", remote + "api_key_file = \"/k\"\napi_key_header = \"x key\"\n", "models.r.api_key_header", "not a header name"},
		{"CA for plain http", "[models.r]\nurl = \"http://h\"\ntls_ca_file = \"/ca.pem\"\n", "models.r.tls_ca_file", "https://"},
		{"api_key_file on a local model", localB + "api_key_file = \"/k\"\n", "models.b.api_key_file", "only used by a remote model"},
		{"overflow_when alone", localB + "overflow_when = \"late\"\n", "models.b.overflow_when", "only used with overflow"},
		{"bad overflow_when", localB + "overflow = [\"r\"]\noverflow_when = \"sometimes\"\n" + remote, "models.b.overflow_when", `"refused", "late"`},
		{"overflow to nothing", localB + "overflow = [\"nope\"]\n", "models.b.overflow", `no model "nope"`},
		{"overflow to a local model", localB + "overflow = [\"c\"]\n[models.c]\ncommand = [\"e\", \"${PORT}\"]\n", "models.b.overflow", "not a remote model"},
		{"overflow listed twice", localB + "overflow = [\"r\", \"r\"]\n" + remote, "models.b.overflow", "listed twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs := problems(t, c.body)
			if len(errs) != 1 {
				t.Fatalf("got %d problems, want 1: %v", len(errs), errs)
			}
			p := errs[0]
			if p.File != "test.toml" || p.Key != c.key || p.Line < 2 || !strings.Contains(p.Message, c.msg) {
				t.Errorf("got %s, want key %s at a line and %q", p, c.key, c.msg)
			}
			if strings.Contains(p.Message, "secret") {
				t.Errorf("the message shows the url's password: %s", p)
			}
		})
	}
}

// A template's engine keys taken by a remote model are refused as the
// model's own would be.
func TestParse_RemoteTakesNoEngineTemplate(t *testing.T) {
	errs := problems(t, "[templates.vllm]\ncommand = [\"vllm\"]\n[models.r]\ntemplate = \"vllm\"\nurl = \"https://h/v1\"\n")
	if len(errs) != 1 || errs[0].Key != "templates.vllm.command" || !strings.Contains(errs[0].Message, "model r is remote (url) and runs no engine here") {
		t.Errorf("got %v", errs)
	}
}
