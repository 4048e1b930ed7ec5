package config

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// vllm is a template a box with many vLLM models shares.
const vllm = `[templates.vllm]
command = ["vllm", "serve", "${hf}", "--port", "${PORT}", "--served-model-name", "${SERVED_NAME}", "--max-model-len", "${ctx}"]
environment = { VLLM_SERVER_DEV_MODE = "1", HF_HOME = "${env:NAPD_TEST_HF_HOME:-/var/cache/hf}" }
sleep = "vllm-l1"
idle_timeout = "10m"
vars = { ctx = "8192" }
`

func TestParse_Templates(t *testing.T) {
	t.Setenv("NAPD_TEST_HF_HOME", "")
	cfg := mustParse(t, vllm+`
[templates.big]
template = "vllm"
gpus = [0, 1]
vars = { ctx = "32768" }

[models.qwen3-8b]
template = "vllm"
vars = { hf = "Qwen/Qwen3-8B" }

[models.llama-70b]
template = "big"
served_name = "llama"
idle_timeout = "1h"
vars = { hf = "meta/Llama-70B" }
`)
	q, l := cfg.Models[0], cfg.Models[1]
	if want := []string{"vllm", "serve", "Qwen/Qwen3-8B", "--port", "${PORT}", "--served-model-name", "qwen3-8b", "--max-model-len", "8192"}; !slices.Equal(q.Command, want) {
		t.Errorf("qwen command %q, want %q", q.Command, want)
	}
	if want := []string{"vllm", "serve", "meta/Llama-70B", "--port", "${PORT}", "--served-model-name", "llama", "--max-model-len", "32768"}; !slices.Equal(l.Command, want) {
		t.Errorf("llama command %q, want %q", l.Command, want)
	}
	if want := map[string]string{"VLLM_SERVER_DEV_MODE": "1", "HF_HOME": "/var/cache/hf"}; !reflect.DeepEqual(q.Environment, want) {
		t.Errorf("environment %v, want %v", q.Environment, want)
	}
	if q.Sleep != "vllm-l1" || l.Sleep != "vllm-l1" || q.IdleTimeout.String() != "10m0s" || l.IdleTimeout.String() != "1h0m0s" {
		t.Errorf("template keys: sleep %s %s, idle %v %v", q.Sleep, l.Sleep, q.IdleTimeout, l.IdleTimeout)
	}
	if !slices.Equal(l.GPUs, []int{0, 1}) || q.GPUs != nil {
		t.Errorf("gpus %v %v", q.GPUs, l.GPUs)
	}
}

// problemCase is a file with one problem: at line, of key, message
// holding msg.
type problemCase struct {
	name, src string
	line      int
	key, msg  string
}

func checkProblems(t *testing.T, cases []problemCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs := problems(t, c.src)
			if !hasProblem(errs, "test.toml", c.line, c.key, c.msg) {
				t.Errorf("want test.toml:%d: %s: %s; got\n%v", c.line, c.key, c.msg, errs)
			}
		})
	}
}

func TestParse_TemplateProblems(t *testing.T) {
	tests := []problemCase{
		{"unknown template", "[templates.a]\nport = 1\n[models.m]\n" + minimal + "template = \"b\"\n", 5, "models.m.template", `unknown template "b" (defined: a)`},
		{"no templates", "[models.m]\n" + minimal + "template = \"b\"\n", 3, "models.m.template", "no [templates.*] is defined"},
		{"template not a string", "[models.m]\n" + minimal + "template = 1\n", 3, "models.m.template", "want a template name"},
		{"cycle", "[templates.a]\ntemplate = \"b\"\n[templates.b]\ntemplate = \"a\"\n", 2, "templates.a.template", "templates a -> b -> a name each other"},
		{"cycle of three", "[templates.c]\ntemplate = \"a\"\n[templates.b]\ntemplate = \"c\"\n[templates.a]\ntemplate = \"b\"\n", 6, "templates.a.template", "templates a -> b -> c -> a"},
		{"self", "[templates.a]\ntemplate = \"a\"\n[models.m]\n" + minimal + "template = \"a\"\n", 2, "templates.a.template", "templates a -> a name each other"},
		{"unknown key in a template", "[templates.a]\n\nslep = \"stop\"\n", 3, "templates.a.slep", "unknown key"},
		{"bad value in a template", "[templates.a]\nsleep = \"x\"\n[models.m]\n" + minimal + "template = \"a\"\n", 2, "templates.a.sleep", "unknown value"},
		{"bad template name", "[templates.A]\nport = 1\n", 1, "templates.A", "template name"},
		{"template not a table", "templates = { a = 1 }\n", 1, "templates.a", "want a table"},
		{"host key in a template", "[templates.a]\nmax_awake = 1\n", 2, "templates.a.max_awake", "unknown key"},
		{"vars not a table", "[models.m]\n" + minimal + "vars = [\"a\"]\n", 3, "models.m.vars", "want a table of strings"},
		{"var not a string", "[models.m]\n" + minimal + "vars = { a = 1 }\n", 3, "models.m.vars.a", "want a string"},
		{"bad var name", "[models.m]\n" + minimal + "vars = { \"a-b\" = \"1\" }\n", 3, "models.m.vars.a-b", "not a variable name"},
		{"builtin var", "[templates.t]\nvars = { PORT = \"1\" }\n", 2, "templates.t.vars.PORT", "napd's own variable"},
		{"template's command and model's unit", "[templates.t]\n" + minimal + "[models.m]\ntemplate = \"t\"\nunit = \"m.service\"\nport = 1\n", 5, "models.m.unit", "both set"},
	}
	checkProblems(t, tests)
}

// A template's bad value is reported once, where it is written, however
// many models take it.
func TestParse_TemplateProblemReportedOnce(t *testing.T) {
	errs := problems(t, "[templates.t]\n"+minimal+"queue = -1\n[models.a]\ntemplate = \"t\"\n[models.b]\ntemplate = \"t\"\n")
	if len(errs) != 1 || errs[0].Key != "templates.t.queue" || errs[0].Line != 3 {
		t.Errorf("got %v, want one problem at test.toml:3 templates.t.queue", errs)
	}
}

func TestParse_Substitutions(t *testing.T) {
	t.Setenv("NAPD_TEST_SET", "from-env")
	t.Setenv("NAPD_TEST_EMPTY", "")
	cfg := mustParse(t, `[models.m]
command = ["e", "--port=${PORT}", "--gpus=${GPUS}", "${MODEL}", "${SERVED_NAME}", "${env:NAPD_TEST_SET}",
  "${env:NAPD_TEST_UNSET:-dflt}", "${env:NAPD_TEST_EMPTY:-dflt}", "[${env:NAPD_TEST_EMPTY}]", "${a}", "$${HOME}", "$HOME", "${b}${b}"]
environment = { X = "${a}", P = "${PORT}" }
health = "/${MODEL}"
gpus = "any"
vars = { a = "A(${b})", b = "${MODEL}-b" }
[models.n]
command = ["e", "${SERVED_NAME}"]
port = 1
served_name = "Org/N"
`)
	m := cfg.Models[0]
	want := []string{"e", "--port=${PORT}", "--gpus=${GPUS}", "m", "m", "from-env", "dflt", "dflt", "[]", "A(m-b)", "$${HOME}", "$HOME", "m-bm-b"}
	if !slices.Equal(m.Command, want) {
		t.Errorf("command\n%q, want\n%q", m.Command, want)
	}
	if want := map[string]string{"X": "A(m-b)", "P": "${PORT}"}; !reflect.DeepEqual(m.Environment, want) {
		t.Errorf("environment %v, want %v", m.Environment, want)
	}
	if m.Health != "/${MODEL}" {
		t.Errorf("health %q: only command, environment, volumes and image take substitutions", m.Health)
	}
	if got := cfg.Models[1].Command[1]; got != "Org/N" {
		t.Errorf("${SERVED_NAME} with served_name = %q", got)
	}
}

func TestParse_SubstitutionProblems(t *testing.T) {
	tests := []problemCase{
		{"unknown", "[models.m]\nport = 1\ncommand = [\"e\", \"${PROT}\"]\n", 3, "models.m.command", "element 1: unknown variable ${PROT} (known: ${PORT}"},
		{"unknown lists the vars", "[models.m]\n" + minimal + "environment = { A = \"${c}\" }\nvars = { a = \"\", b = \"\" }\n", 3, "models.m.environment", "A: unknown variable ${c} (known: ${PORT}, ${GPUS}, ${MODEL}, ${SERVED_NAME}, ${env:NAME} and the vars a, b"},
		{"unset env", "[models.m]\n" + minimal + "environment = { A = \"${env:NAPD_TEST_NEVER_SET}\" }\n", 3, "models.m.environment", "NAPD_TEST_NEVER_SET is not set in napd's environment"},
		{"bad env name", "[models.m]\n" + minimal + "environment = { A = \"${env:1X}\" }\n", 3, "models.m.environment", "not an environment variable name"},
		{"unterminated", "[models.m]\nport = 1\ncommand = [\"e\", \"${PORT\"]\n", 3, "models.m.command", `without its closing "}"`},
		{"var cycle", "[models.m]\nport = 1\ncommand = [\"${a}\"]\nvars = { a = \"${b}\", b = \"${a}\" }\n", 3, "models.m.command", "vars a -> b -> a refer to each other"},
		{"unknown in a var", "[models.m]\nport = 1\ncommand = [\"${a}\"]\nvars = { a = \"${nope}\" }\n", 3, "models.m.command", "var a (test.toml:4): unknown variable ${nope}"},
		{"in a template, for one model", "[templates.t]\nport = 1\ncommand = [\"e\", \"${x}\"]\n[models.m]\ntemplate = \"t\"\n[models.n]\ntemplate = \"t\"\nvars = { x = \"1\" }\n", 3, "templates.t.command", "in model m: element 1: unknown variable ${x}"},
		{"GPUS without gpus", "[models.m]\n" + minimal + "environment = { G = \"${GPUS}\" }\n", 3, "models.m.environment", "${GPUS} is the GPUs napd gives"},
		{"PORT from a var counts", "[models.m]\ncommand = [\"e\"]\nenvironment = { P = \"${p}\" }\nvars = { p = \"${MODEL}\" }\n", 2, "models.m.command", "pass ${PORT}"},
	}
	checkProblems(t, tests)
	// ${PORT} through a var is a port mention.
	mustParse(t, "[models.m]\ncommand = [\"e\", \"${p}\"]\nvars = { p = \"--port=${PORT}\" }\n")
}

func TestExpandGPUs(t *testing.T) {
	m := &Model{
		Command:     []string{"e", "--port", "${PORT}", "--dev=${GPUS}", "$${PORT}", "$${GPUS}", "${HOME}"},
		Environment: map[string]string{"A": "${GPUS}:${PORT}"},
	}
	cmd, env := m.ExpandPort(8101)
	cmd, env = ExpandGPUs(cmd, env, []int{2, 0})
	if want := []string{"e", "--port", "8101", "--dev=2,0", "${PORT}", "${GPUS}", "${HOME}"}; !slices.Equal(cmd, want) {
		t.Errorf("command %q, want %q", cmd, want)
	}
	if env["A"] != "2,0:8101" {
		t.Errorf("env %v", env)
	}
	if cmd, _ := ExpandGPUs([]string{"${GPUS}"}, nil, nil); cmd[0] != "" {
		t.Errorf("no GPUs: %q", cmd)
	}
	if m.Command[2] != "${PORT}" {
		t.Error("the model changed")
	}
}

func FuzzSubstitute(f *testing.F) {
	for _, s := range []string{"", "plain", "${PORT}", "$${x}", "${a}${b}", "${", "$$${x}}", "${env:X:-y}", "a}${b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var names []string
		out, err := scan(s, false, func(n string) (string, error) {
			names = append(names, n)
			return keep(n), nil
		})
		if err != nil {
			if !strings.Contains(s, "${") {
				t.Fatalf("error %v for %q without ${", err, s)
			}
			return
		}
		// Keeping every name and every escape is the identity.
		if out != s {
			t.Fatalf("scan(%q) kept = %q", s, out)
		}
		for _, n := range names {
			if !mentions(s, n) {
				t.Fatalf("mentions(%q, %q) = false", s, n)
			}
		}
		if !strings.Contains(s, "$") {
			if got := replace(s, varPort, "1", true); got != s {
				t.Fatalf("replace changed %q without $: %q", s, got)
			}
		}
	})
}

// Show writes the effective configuration: set keys with their file:line
// (a template's marked), [policy]'s inherited ones, defaults commented
// out; reading it back gives the same models.
func TestShow(t *testing.T) {
	path := writeTree(t, map[string]string{
		"napd.toml": "[policy]\nidle_timeout = \"20m\"\n\n[models.a]\n" + minimal + "aliases = [\"alpha\"]\n",
		"napd.d/b.toml": vllm + `
[models."b.2"]
template = "vllm"
vars = { hf = "Org/B" }
port = 8200
`,
	})
	t.Setenv("NAPD_TEST_HF_HOME", "/srv/hf")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	if err := cfg.Show(&all, ""); err != nil {
		t.Fatal(err)
	}
	out := all.String()
	dropIn := cfg.DropIns[0]
	for _, want := range []string{
		"[agent]\n", "#include_dir = \"napd.d\"  # default\n",
		"[policy]\n", "idle_timeout = \"20m\"  # " + path + ":2\n",
		"[models.a]\n", "idle_timeout = \"20m\"  # " + path + ":2 ([policy])\n", "aliases = [\"alpha\"]  # " + path + ":6\n",
		"#health = \"/health\"  # default\n",
		"[models.\"b.2\"]\n# template: vllm\n",
		`command = ["vllm", "serve", "Org/B", "--port", "${PORT}", "--served-model-name", "b.2", "--max-model-len", "8192"]  # ` + dropIn + ":2 (template vllm)\n",
		`environment = { HF_HOME = "/srv/hf", VLLM_SERVER_DEV_MODE = "1" }  # ` + dropIn + ":3 (template vllm)\n",
		"port = 8200  # " + dropIn + ":11\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	back, err := Parse("shown.toml", all.Bytes())
	if err != nil {
		t.Fatalf("the shown config does not parse: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(back.Models, cfg.Models) {
		t.Errorf("models read back differ:\n%+v\n%+v", back.Models[1], cfg.Models[1])
	}

	var one bytes.Buffer
	if err := cfg.Show(&one, "alpha"); err != nil {
		t.Fatal(err)
	}
	if s := one.String(); !strings.Contains(s, "[models.a]") || strings.Contains(s, "[agent]") || strings.Contains(s, "b.2") {
		t.Errorf("show alpha:\n%s", s)
	}
	if err := cfg.Show(&one, "nope"); err == nil || !strings.Contains(err.Error(), `no model or alias "nope"`) {
		t.Errorf("show nope: %v", err)
	}
	if s := cfg.Settings(toml.Key{"models", "b.2"}.String()); len(s) == 0 {
		t.Error("no settings for models.\"b.2\"")
	}
}
