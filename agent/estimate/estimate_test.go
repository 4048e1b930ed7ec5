package estimate

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const GiB = 1 << 30

// sparse creates a sparse file of size bytes: no disk is used.
func sparse(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

func TestFromFiles(t *testing.T) {
	dir := t.TempDir()
	gguf := filepath.Join(dir, "m.Q4.gguf")
	sparse(t, gguf, 5*GiB)
	st := filepath.Join(dir, "hf")
	if err := os.Mkdir(st, 0o755); err != nil {
		t.Fatal(err)
	}
	sparse(t, filepath.Join(st, "model-00001.safetensors"), 6*GiB)
	sparse(t, filepath.Join(st, "model-00002.safetensors"), 4*GiB)
	sparse(t, filepath.Join(st, "tokenizer.json"), 1*GiB) // not weights
	tests := []struct {
		name string
		argv []string
		want int64
		from string
	}{
		{"gguf path", []string{"llama-server", "-m", gguf, "--port", "1"}, 6*GiB + Overhead, "5.0 GiB of .gguf"},
		{"gguf flag=path", []string{"llama-server", "--model=" + gguf}, 6*GiB + Overhead, ".gguf"},
		{"safetensors dir", []string{"vllm", "serve", st}, 12*GiB + Overhead, "10.0 GiB of .safetensors × 1.2 + 1.0 GiB"},
		{"named twice counts once", []string{"x", gguf, gguf}, 6*GiB + Overhead, ""},
		{"nothing", []string{"engine", "--port", "${PORT}", dir}, 0, ""},
		{"missing file", []string{"engine", filepath.Join(dir, "gone.gguf")}, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := FromFiles(tt.argv)
			if e.Bytes != tt.want || !strings.Contains(e.From, tt.from) {
				t.Errorf("FromFiles = %d %q, want %d %q", e.Bytes, e.From, tt.want, tt.from)
			}
		})
	}
}

func TestFromUtilization(t *testing.T) {
	tests := []struct {
		argv  []string
		total int64
		want  int64
	}{
		{[]string{"vllm", "serve", "m", "--gpu-memory-utilization", "0.5"}, 80 * GiB, 40 * GiB},
		{[]string{"vllm", "serve", "m", "--gpu-memory-utilization=0.25"}, 80 * GiB, 20 * GiB},
		{[]string{"vllm", "serve", "m", "--gpu-memory-utilization", "1.5"}, 80 * GiB, 0},
		{[]string{"vllm", "serve", "m", "--gpu-memory-utilization", "0.5"}, 0, 0},
		{[]string{"vllm", "serve", "m"}, 80 * GiB, 0},
	}
	for _, tt := range tests {
		if got := FromUtilization(tt.argv, tt.total).Bytes; got != tt.want {
			t.Errorf("FromUtilization(%q, %d) = %d, want %d", tt.argv, tt.total, got, tt.want)
		}
	}
}

func TestWeightFiles(t *testing.T) {
	dir := t.TempDir()
	gguf := filepath.Join(dir, "m.gguf")
	sparse(t, gguf, 5)
	st := filepath.Join(dir, "hf")
	if err := os.Mkdir(st, 0o755); err != nil {
		t.Fatal(err)
	}
	sparse(t, filepath.Join(st, "a.safetensors"), 6)
	sparse(t, filepath.Join(st, "tokenizer.json"), 1)
	extra := filepath.Join(dir, "extra")
	if err := os.Mkdir(extra, 0o755); err != nil {
		t.Fatal(err)
	}
	sparse(t, filepath.Join(extra, "w.bin"), 7)
	got := WeightFiles([]string{"engine", "--model=" + gguf, st}, []string{extra, gguf, filepath.Join(dir, "gone")})
	want := []File{{gguf, 5}, {filepath.Join(st, "a.safetensors"), 6}, {filepath.Join(extra, "w.bin"), 7}}
	if !slices.Equal(got, want) {
		t.Fatalf("WeightFiles = %v, want %v", got, want)
	}
}
