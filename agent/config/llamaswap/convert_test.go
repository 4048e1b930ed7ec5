package llamaswap

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/napd/napd/agent/config"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func convertFile(t *testing.T, name string) *Result {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Convert(data, Options{File: name, KeysFile: "/etc/napd/keys"})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// isContainer reports a model converted to napd's container keys, which
// napd --check of this tree does not know yet (issue #31 adds them).
func isContainer(m Model) bool { return strings.Contains(m.TOML, "\nimage = ") }

// The example covers every key llama-swap documents; its conversion is
// pinned by a golden file (go test -update rewrites it).
func TestConvert_ExampleGolden(t *testing.T) {
	res := convertFile(t, "config.example.yaml")
	got := res.Main() + "\n# keys file:\n" + res.Keys + "\n# converted:\n# " + strings.Join(res.Converted, "\n# ") +
		"\n# not converted:\n# " + strings.Join(res.Dropped, "\n# ") + "\n"
	golden := filepath.Join("testdata", "config.example.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("conversion differs from %s (go test -update to accept):\n%s", golden, got)
	}
}

// What napd can run of the example passes napd's own parser, as one file
// and as a main file with one drop-in per model, and means what the
// llama-swap keys meant.
func TestConvert_ExamplePassesNapdCheck(t *testing.T) {
	res := convertFile(t, "config.example.yaml")
	res.Models = slices.DeleteFunc(res.Models, isContainer)
	cfg, err := config.Parse("converted.toml", []byte(res.Main()))
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Main())
	}
	if len(cfg.Models) != 3 {
		t.Fatalf("%d models, want llama, qwen-qwen3-30b and qwen-unlisted", len(cfg.Models))
	}
	if cfg.Agent.LogLevel != "info" || cfg.Gateway.ListAliases || cfg.Gateway.APIKeysFile != "/etc/napd/keys" ||
		cfg.Policy.IdleTimeout != 900*time.Second || cfg.Policy.WakeTimeout != 500*time.Second {
		t.Errorf("host settings: agent %+v gateway keys %q aliases %v policy %+v", cfg.Agent, cfg.Gateway.APIKeysFile, cfg.Gateway.ListAliases, cfg.Policy)
	}
	llama, qwen, unlisted := cfg.Models[0], cfg.Models[1], cfg.Models[2]
	if llama.Port != 8999 || !slices.Equal(llama.Aliases, []string{"gpt-4o-mini", "gpt-3.5-turbo"}) || llama.Health != "/custom-endpoint" ||
		llama.IdleTimeout != time.Minute || llama.StopTimeout != 10*time.Second || llama.ServedName != "qwen:qwq" ||
		llama.MaxConcurrency != 4 || !llama.WarmOnStart || llama.WakeProgress || llama.Environment["CUDA_VISIBLE_DEVICES"] != "0,1,2" {
		t.Errorf("llama: %+v", llama)
	}
	if want := []string{"/path/to/llama-server/llama-server-ec9e0301", "--port", "${PORT}", "--model",
		"/path/to/models/llama-8B-Q4_K_M.gguf", "--ctx-size", "4096", "--temp", "0.7"}; !slices.Equal(llama.Command, want) {
		t.Errorf("llama command %q, want %q", llama.Command, want)
	}
	if qwen.Name != "qwen-qwen3-30b" || !slices.Equal(qwen.Aliases, []string{"Qwen/Qwen3-30B"}) || !qwen.WakeProgress ||
		qwen.Port != 0 || qwen.IdleTimeout != 900*time.Second || qwen.Command[4] != "/models/Qwen3 30B/model.gguf" {
		t.Errorf("qwen: %+v", qwen)
	}
	if unlisted.WarmOnStart || unlisted.Health != "/health" {
		t.Errorf("qwen-unlisted: %+v", unlisted)
	}
	if res.Keys != "# API keys converted from llama-swap's apiKeys; name:key, one a line (docs/keys.md).\nllama-swap-1:sk-first-key\nllama-swap-2:sk-second-key\n" {
		t.Errorf("keys file:\n%s", res.Keys)
	}

	// As drop-ins: the host part is the main file, each model a file.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "napd.toml"), []byte(res.Host), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "napd.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, m := range res.Models {
		if m.Converted {
			if err := os.WriteFile(filepath.Join(dir, "napd.d", m.Name+".toml"), []byte(m.TOML), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	split, err := config.Load(filepath.Join(dir, "napd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(split.Models) != 3 || len(split.DropIns) != 3 {
		t.Errorf("as drop-ins: %d models from %d drop-ins", len(split.Models), len(split.DropIns))
	}
}

func TestConvert_Summary(t *testing.T) {
	res := convertFile(t, "config.example.yaml")
	for _, want := range []string{"models: 4 (llama, qwen-qwen3-30b, qwen-unlisted, docker-llama)", "globalTTL -> [policy] idle_timeout",
		"apiKeys -> /etc/napd/keys (2 keys)", "hooks.on_startup.preload -> warm_on_start of llama, gpt-3.5-turbo"} {
		if !slices.Contains(res.Converted, want) {
			t.Errorf("converted lacks %q: %q", want, res.Converted)
		}
	}
	for _, want := range []string{"groups (group1, forever): napd has no groups: its room scheduling replaces their swap rules",
		"peers:", "profiles:", "selectors:", "models.llama.filters:", "models.qwen-unlisted.cmdStop:", "models.remote: not converted"} {
		if !slices.ContainsFunc(res.Dropped, func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Errorf("not converted lacks %q: %q", want, res.Dropped)
		}
	}
	// Each dropped setting is a comment where it was.
	main := res.Main()
	for _, want := range []string{"# groups (group1, forever): dropped:", "# peers: dropped:", "# filters: dropped:", "# [models.remote]"} {
		if !strings.Contains(main, want) {
			t.Errorf("no comment %q in\n%s", want, main)
		}
	}
}

func TestConvert_Macros(t *testing.T) {
	res := convertFile(t, "macros.yaml")
	cfg, err := config.Parse("macros.toml", []byte(res.Main()))
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Main())
	}
	coder, chat := cfg.Models[0], cfg.Models[1]
	if want := []string{"/opt/llama.cpp/llama-server", "--host", "127.0.0.1", "--port", "${PORT}", "--model", "/models/Qwen Coder/q4.gguf",
		"--ctx-size", "32768", "--alias", "coder", "--n-gpu-layers", "99", "--flash-attn", "--chat-template-kwargs", `{"enable_thinking": false}`}; !slices.Equal(coder.Command, want) {
		t.Errorf("coder command\n%q, want\n%q", coder.Command, want)
	}
	if want := []string{"/opt/llama.cpp/llama-server", "--host", "127.0.0.1", "--port", "${PORT}", "--model", "/models/chat.gguf",
		"--ctx-size", "8192", "--reasoning-format", "none", "--system-prompt", `say "hi" to chat`}; !slices.Equal(chat.Command, want) {
		t.Errorf("chat command\n%q, want\n%q", chat.Command, want)
	}
	if chat.Environment["TAG"] != "chat-8192" || coder.IdleTimeout != 5*time.Minute || chat.IdleTimeout != 0 {
		t.Errorf("env %v, idle %v %v", chat.Environment, coder.IdleTimeout, chat.IdleTimeout)
	}
}

// Docker and podman lines become container models: the keys of napd's
// container engines, checked as text (napd --check of this tree does not
// know them yet).
func TestConvert_Containers(t *testing.T) {
	res := convertFile(t, "containers.yaml")
	want := []string{`[models.docker-vllm]
image = "vllm/vllm-openai:latest"  # cmd: docker run
container_runtime = "docker"
command = ["--model", "Qwen/Qwen3-8B"]  # the container's command, after the image
volumes = ["/srv/hf:/root/.cache/huggingface"]  # --volume
container_args = ["--gpus", "device=0", "--ipc=host", "--env", "HF_TOKEN"]  # the run line's other options
container_port = 8000  # --publish: the engine's port in the container
environment = { VLLM_LOGGING_LEVEL = "INFO" }  # env and the run line's --env
`, `[models.podman-llama]
port = 9100  # proxy
image = "localhost/llama-server:b6000"  # cmd: podman run
container_runtime = "podman"
command = ["--port", "9100", "-m", "/models/m.gguf"]  # the container's command, after the image
volumes = ["/models:/models:ro,Z"]  # --volume
container_args = ["--replace", "--network", "host"]  # the run line's other options
pull = "newer"  # --pull
`}
	for i, m := range res.Models {
		if m.TOML != want[i] {
			t.Errorf("model %s:\n%s\nwant\n%s", m.Name, m.TOML, want[i])
		}
	}
	if !slices.Contains(res.Converted, "models.docker-vllm.cmdStop: napd stops the docker container itself") {
		t.Errorf("cmdStop not recognised: %q", res.Converted)
	}
	if _, err := toml.Decode(res.Main(), new(map[string]any)); err != nil {
		t.Errorf("not TOML: %v", err)
	}
}

func TestConvert_Errors(t *testing.T) {
	for _, c := range []struct {
		name, src string
		opts      Options
		line      int
		msg       string
	}{
		{"not YAML", "models:\n  a:\n    cmd: [x\n", Options{}, 2, "not YAML"},
		{"tabs", "models:\n\ta: 1\n", Options{}, 2, "not YAML"},
		{"empty", "", Options{}, 1, "empty"},
		{"not a mapping", "- a\n- b\n", Options{}, 1, "the configuration: want a mapping"},
		{"no models", "logLevel: info\n", Options{}, 1, "no models"},
		{"model without cmd", "models:\n  a:\n    cmd: x ${PORT}\n  b:\n    proxy: http://127.0.0.1:1\n", Options{}, 4, "models.b: no cmd"},
		{"unknown macro", "models:\n  a:\n    cmd: x ${PORT} ${nope}\n", Options{}, 3, "models.a.cmd: unknown macro ${nope}"},
		{"macro cycle", "macros:\n  a: ${b}\n  b: ${a}\nmodels:\n  m:\n    cmd: ${a}\n", Options{}, 6, "macros a -> b -> a refer to each other"},
		{"macro bomb", "macros:\n  a: ${b}${b}${b}${b}${b}${b}${b}${b}\n  b: ${c}${c}${c}${c}${c}${c}${c}${c}\n  c: ${d}${d}${d}${d}${d}${d}${d}${d}\n" +
			"  d: ${e}${e}${e}${e}${e}${e}${e}${e}\n  e: ${f}${f}${f}${f}${f}${f}${f}${f}\n  f: ${g}${g}${g}${g}${g}${g}${g}${g}\n  g: xxxxxxxxxxxxxxxx\n" +
			"models:\n  m:\n    cmd: ${a}\n", Options{}, 11, "more than"},
		{"quote not closed", "models:\n  a:\n    cmd: |\n      x --port ${PORT}\n      --name 'b\n", Options{}, 5, "a ' that is not closed"},
		{"apiKeys without a file", "apiKeys: [k]\nmodels:\n  a:\n    cmd: x ${PORT}\n", Options{}, 1, "give --keys FILE"},
		{"apiKey with a space", "apiKeys: [\"a b\"]\nmodels:\n  a:\n    cmd: x ${PORT}\n", Options{KeysFile: "/k"}, 1, "key 1"},
		{"bad env", "models:\n  a:\n    cmd: x ${PORT}\n    env: [\"NOEQUALS\"]\n", Options{}, 4, "not NAME=value"},
		{"bad ttl", "models:\n  a:\n    cmd: x ${PORT}\n    ttl: soon\n", Options{}, 4, "models.a.ttl: want a whole number"},
		{"bad logLevel", "logLevel: loud\nmodels:\n  a:\n    cmd: x\n", Options{}, 1, "unknown level"},
		{"models not a mapping", "models: [a]\n", Options{}, 1, "models: want a mapping"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.opts.File = "ls.yaml"
			_, err := Convert([]byte(c.src), c.opts)
			var e *Error
			if !errors.As(err, &e) || e.File != "ls.yaml" || e.Line != c.line || !strings.Contains(e.Msg, c.msg) {
				t.Errorf("err %v, want ls.yaml:%d: …%s…", err, c.line, c.msg)
			}
		})
	}
}

func TestSplitCommand(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"a b\tc\nd", []string{"a", "b", "c", "d"}},
		{`a "b c" 'd e' f\ g`, []string{"a", "b c", "d e", "f g"}},
		{"a \\\n  b", []string{"a", "b"}},
		{`"a\"b" 'a\"b' "a\nb"`, []string{`a"b`, `a\"b`, `a\nb`}},
		{"# a comment\na # another\nb", []string{"a", "b"}},
		{"a#b", []string{"a#b"}},
		{`x="" ''`, []string{"x=", ""}},
		{"  ", nil},
	} {
		got, _, err := splitCommand(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("splitCommand(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	if _, line, err := splitCommand("a\nb \"c\nd"); err == nil || line != 2 {
		t.Errorf("open quote: line %d, %v", line, err)
	}
}

// Whatever the input, Convert ends, and what it writes is TOML.
func FuzzConvert(f *testing.F) {
	for _, name := range []string{"config.example.yaml", "macros.yaml", "containers.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("a: &x [*x]\nmodels:\n  m: {cmd: \"x ${PORT}\", <<: *x}\n"))
	f.Add([]byte("models:\n  \"\\u0000\":\n    cmd: \"\\\"\"\n"))
	// Found by the fuzzer: a proxy's host, percent-decoded, is no UTF-8.
	f.Add([]byte("models:\n  m:\n    cmd: x\n    proxy: \"http://l%800:1\"\n"))
	f.Add([]byte("models:\n  m:\n    cmd: x\n    proxy: \"http://l\\x01\\x7f:1\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Convert(data, Options{File: "fuzz.yaml", KeysFile: "/k"})
		if err != nil {
			return
		}
		if _, err := toml.Decode(res.Main(), new(map[string]any)); err != nil {
			t.Fatalf("output is not TOML: %v\n%s", err, res.Main())
		}
	})
}
