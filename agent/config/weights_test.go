package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParse_WarmWeights(t *testing.T) {
	if got := mustParse(t, "").Policy.WarmWeights; got != WarmWeightsAuto {
		t.Errorf("default warm_weights = %d, want auto", got)
	}
	for src, want := range map[string]int64{`"auto"`: WarmWeightsAuto, `"off"`: 0, `"64GiB"`: 64 << 30} {
		if got := mustParse(t, "[policy]\nwarm_weights = "+src+"\n").Policy.WarmWeights; got != want {
			t.Errorf("warm_weights = %s: %d, want %d", src, got, want)
		}
	}
	for src, msg := range map[string]string{`"0"`: `write "off"`, `"lots"`: `want "auto", "off" or a size`, `64`: "got integer"} {
		errs := problems(t, "[policy]\nwarm_weights = "+src+"\n")
		if len(errs) != 1 || errs[0].Line != 2 || errs[0].Key != "policy.warm_weights" || !strings.Contains(errs[0].Message, msg) {
			t.Errorf("warm_weights = %s: %v, want line 2 policy.warm_weights %q", src, errs, msg)
		}
	}
}

func TestParse_Weights(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(file, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, fmt.Sprintf("[models.a]\n%sworking_directory = %q\nweights = [%q, \"m.gguf\"]\n", minimal, dir, dir+"/"))
	if got, want := cfg.Models[0].Weights, []string{dir + "/", file}; !slices.Equal(got, want) {
		t.Fatalf("weights = %q, want %q", got, want)
	}
}

// A weights path that is missing, unreadable or no file or directory is
// an error naming file, line, key and the element.
func TestParse_WeightsBadPaths(t *testing.T) {
	dir := t.TempDir()
	locked := filepath.Join(dir, "locked.gguf")
	if err := os.WriteFile(locked, nil, 0); err != nil {
		t.Fatal(err)
	}
	tests := map[string]string{
		filepath.Join(dir, "gone.gguf"): "element 0: " + filepath.Join(dir, "gone.gguf") + ": no such file or directory",
		"/dev/null":                     "element 0: /dev/null is not a regular file or a directory",
		"rel.gguf":                      `element 0: "rel.gguf" is a relative path and working_directory is not set`,
	}
	if os.Geteuid() != 0 { // root reads any file
		tests[locked] = "element 0: " + locked + " cannot be read: permission denied"
	}
	for path, msg := range tests {
		errs := problems(t, fmt.Sprintf("[models.a]\n%sweights = [%q]\n", minimal, path))
		if len(errs) != 1 || errs[0].File != "test.toml" || errs[0].Line != 3 || errs[0].Key != "models.a.weights" || !strings.Contains(errs[0].Message, msg) {
			t.Errorf("weights = [%q]: %v; want test.toml:3: models.a.weights: %s", path, errs, msg)
		}
	}
}
