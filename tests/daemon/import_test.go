package daemon

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napd/napd/tests/harness"
)

// macrosConfig is the importer's test configuration without containers
// (napd --check of this tree does not know the container keys yet).
var macrosConfig = filepath.Join(harness.RepoRoot(), "agent", "config", "llamaswap", "testdata", "macros.yaml")

// napctl import llama-swap as an operator runs it: its output passes napd
// --check, as one file and as drop-ins, with the apiKeys in a keys file;
// the summary is on standard error; nothing is overwritten; bad input is
// an error naming the line.
func TestImport_LlamaSwap(t *testing.T) {
	bin := harness.Bin(t)
	dir := t.TempDir()
	run := func(wantOK bool, name string, args ...string) (string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); (err == nil) != wantOK {
			t.Fatalf("%s %s: %v (want ok %v)\n%s%s", name, strings.Join(args, " "), err, wantOK, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src, err := os.ReadFile(macrosConfig)
	if err != nil {
		t.Fatal(err)
	}
	withKeys := filepath.Join(dir, "config.yaml")
	write(withKeys, "apiKeys: [sk-one, sk-two]\n"+string(src))

	// One file on standard output.
	keys := filepath.Join(dir, "keys")
	out, summary := run(true, "napctl", "import", "llama-swap", withKeys, "--keys", keys)
	if !strings.Contains(summary, "models: 2 (coder, chat)") || !strings.Contains(summary, "apiKeys -> "+keys) {
		t.Errorf("summary:\n%s", summary)
	}
	if fi, err := os.Stat(keys); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("keys file: %v %v", fi, err)
	}
	main := filepath.Join(dir, "napd.toml")
	write(main, out+"\n[agent]\nstate_dir = \""+filepath.Join(dir, "state")+"\"\ncontrol_socket = \""+filepath.Join(dir, "c.sock")+"\"\ninclude_dir = \"\"\n")
	if out, _ := run(true, "napd", "--check", "--config", main); !strings.Contains(out, "ok (2 models)") {
		t.Errorf("napd --check: %s", out)
	}
	// A second import would overwrite the keys: refused.
	if _, stderr := run(false, "napctl", "import", "llama-swap", withKeys, "--keys", keys); !strings.Contains(stderr, "overwrites nothing") {
		t.Errorf("second import: %s", stderr)
	}

	// One drop-in per model; the main file's part on standard output.
	conf := filepath.Join(dir, "etc")
	if err := os.Mkdir(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	host, _ := run(true, "napctl", "import", "llama-swap", macrosConfig, "--out", filepath.Join(conf, "napd.d"))
	write(filepath.Join(conf, "napd.toml"), host+"\n[agent]\nstate_dir = \""+filepath.Join(dir, "state")+"\"\ncontrol_socket = \""+filepath.Join(dir, "c.sock")+"\"\n")
	if out, _ := run(true, "napd", "--check", "--config", filepath.Join(conf, "napd.toml")); !strings.Contains(out, "ok (2 models, 2 drop-ins)") {
		t.Errorf("napd --check of the drop-ins: %s", out)
	}

	// Bad input: the file and the line.
	bad := filepath.Join(dir, "bad.yaml")
	write(bad, "models:\n  a:\n    proxy: http://127.0.0.1:1\n")
	if _, stderr := run(false, "napctl", "import", "llama-swap", bad); !strings.Contains(stderr, bad+":2: models.a: no cmd") {
		t.Errorf("model without cmd: %s", stderr)
	}
	write(bad, "models: [\n")
	if _, stderr := run(false, "napctl", "import", "llama-swap", bad); !strings.Contains(stderr, bad+":1: not YAML") {
		t.Errorf("not YAML: %s", stderr)
	}
}
