// Package estimate guesses a model's GPU footprint before its first wake,
// when neither gpu_memory nor a measured footprint exists: from the model
// files its command names, or from vLLM's --gpu-memory-utilization. The
// guess only stands in until napd measures the engine awake.
package estimate

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Overhead is the fixed GPU memory an engine takes beyond its weights
// (CUDA context, compute buffers, a small KV cache).
const Overhead = 1 << 30

// Estimate is a footprint guess and what it was made from.
type Estimate struct {
	Bytes int64
	From  string // for status and logs, e.g. "4.1 GiB of .gguf × 1.2 + 1.0 GiB"
}

// FromFiles sums the model files argv names (WeightFiles). It returns 0
// when there are none.
func FromFiles(argv []string) Estimate {
	var total int64
	var kinds []string
	for _, f := range WeightFiles(argv, nil) {
		total += f.Size
		kinds = appendOnce(kinds, strings.ToLower(filepath.Ext(f.Path)))
	}
	if total == 0 {
		return Estimate{}
	}
	return Estimate{Bytes: total*6/5 + Overhead,
		From: fmt.Sprintf("%s of %s × 1.2 + %s engine overhead", gib(total), strings.Join(kinds, " and "), gib(Overhead))}
}

// File is one weight file and its size.
type File struct {
	Path string
	Size int64
}

// WeightFiles are a model's weight files: the files ending in .gguf that
// argv names, the .safetensors files of the directories it names (not
// descending further), and extra (a model's weights key): files, or
// directories of which every regular file counts. An argument may be a
// path or --flag=path. A file is listed once; what cannot be read is left
// out.
func WeightFiles(argv, extra []string) []File {
	var files []File
	seen := map[string]bool{}
	add := func(path string, fi os.FileInfo) {
		if !seen[path] {
			seen[path] = true
			files = append(files, File{Path: path, Size: fi.Size()})
		}
	}
	for _, arg := range argv {
		if _, v, ok := strings.Cut(arg, "="); ok && strings.HasPrefix(arg, "-") {
			arg = v
		}
		if arg == "" || strings.HasPrefix(arg, "-") {
			continue
		}
		fi, err := os.Stat(arg)
		switch {
		case err != nil:
		case fi.Mode().IsRegular() && strings.HasSuffix(strings.ToLower(arg), ".gguf"):
			add(arg, fi)
		case fi.IsDir():
			dirFiles(arg, ".safetensors", add)
		}
	}
	for _, p := range extra {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			add(p, fi)
		} else if err == nil && fi.IsDir() {
			dirFiles(p, "", add)
		}
	}
	return files
}

// dirFiles hands add the regular files of dir whose names end in suffix.
func dirFiles(dir, suffix string, add func(string, os.FileInfo)) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), suffix) || !e.Type().IsRegular() {
			continue
		}
		if fi, err := e.Info(); err == nil {
			add(filepath.Join(dir, e.Name()), fi)
		}
	}
}

// FromUtilization is vLLM's --gpu-memory-utilization × the total memory of
// the GPUs the model runs on (vLLM takes that share of each); zero when
// argv does not pass the flag or gpuTotal is unknown.
func FromUtilization(argv []string, gpuTotal int64) Estimate {
	const flag = "--gpu-memory-utilization"
	for i, arg := range argv {
		var v string
		switch {
		case arg == flag && i+1 < len(argv):
			v = argv[i+1]
		case strings.HasPrefix(arg, flag+"="):
			v = strings.TrimPrefix(arg, flag+"=")
		default:
			continue
		}
		u, err := strconv.ParseFloat(v, 64)
		if err != nil || u <= 0 || u > 1 || gpuTotal <= 0 {
			return Estimate{}
		}
		return Estimate{Bytes: int64(u * float64(gpuTotal)),
			From: fmt.Sprintf("%s %g × %s of GPU memory", flag, u, gib(gpuTotal))}
	}
	return Estimate{}
}

func appendOnce(xs []string, x string) []string {
	if slices.Contains(xs, x) {
		return xs
	}
	return append(xs, x)
}

func gib(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }
