// Package sdk_test runs the official OpenAI and Anthropic SDKs for Node
// (npm `openai`, `@anthropic-ai/sdk`, pinned in package-lock.json and
// installed unmodified from the npm registry) against a real napd in front
// of real demo engines: a chat completion, a stream, an embedding, a
// transcription upload and Anthropic messages.
package sdk_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

const apiKey = "sk-napd-sdk-test"

func TestOfficialSDKs(t *testing.T) {
	dir := installSDKs(t)
	keys := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(keys, []byte("sdk:"+apiKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fast := []string{"--ttft", "5ms", "--tokens-per-second", "0"}
	// The chat engine knows its model only as "org/chat-model": napd
	// rewrites the model and maps the answers back (served_name).
	chat := fmt.Sprintf(`[models.chat]
command = ["${BIN}/napd-demo-engine", "--host", "127.0.0.1", "--port", "${PORT}", "--model", "org/chat-model", %q, %q, %q, %q]
served_name = "org/chat-model"
aliases = ["claude-demo"]
`, fast[0], fast[1], fast[2], fast[3])
	n := harness.Start(t, harness.Options{
		Gateway: fmt.Sprintf("api_keys_file = %q\n", keys),
		Models:  chat + harness.DemoModel("embed", "", fast...) + harness.DemoModel("whisper", "", fast...),
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "clients.mjs"))
	cmd.Env = append(os.Environ(), "NAPD_URL=http://"+n.Addr, "NAPD_KEY="+apiKey)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("node clients.mjs: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var summary struct {
		OK   bool
		Done []string
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &summary); err != nil || !summary.OK {
		t.Fatalf("summary %q: %v\n%s", lines[len(lines)-1], err, out.String())
	}
	want := []string{"chat", "stream", "embedding", "transcription", "message", "message-stream", "count-tokens", "anthropic-error"}
	if strings.Join(summary.Done, ",") != strings.Join(want, ",") {
		t.Errorf("checks done %v, want %v", summary.Done, want)
	}
	// The key never reached a log line.
	if strings.Contains(n.Log(), apiKey) {
		t.Error("napd logged the API key")
	}
}

// installSDKs installs the pinned packages with `npm ci` (once per
// package-lock.json, into the user's cache directory) beside a copy of
// clients.mjs, and returns that directory. Node and npm come from the
// Debian packages scripts/test-deps.sh installs.
func installSDKs(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run `make test-deps` (Debian packages nodejs and npm)", tool)
		}
	}
	src := filepath.Join(harness.RepoRoot(), "tests", "sdk")
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pkg, lock, script := read("package.json"), read("package-lock.json"), read("clients.mjs")
	sum := sha256.Sum256(append(append([]byte{}, pkg...), lock...))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "napd-tests", "sdk-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		// Installed beside, then renamed into place: a concurrent run or
		// an interrupted install never leaves a half-filled directory.
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		tmp, err := os.MkdirTemp(filepath.Dir(dir), "install-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		for name, b := range map[string][]byte{"package.json": pkg, "package-lock.json": lock} {
			if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci (from the npm registry): %v\n%s", err, out)
		}
		if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
			if _, statErr := os.Stat(filepath.Join(dir, "node_modules")); statErr != nil {
				t.Fatalf("install into %s: %v", dir, err)
			}
		}
	}
	// The script runs from beside node_modules, so its imports resolve
	// there; it is copied afresh each run.
	if err := os.WriteFile(filepath.Join(dir, "clients.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
