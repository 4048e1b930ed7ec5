package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTree writes files (relative name -> content) under a new directory
// and returns the main file's path, dir/napd.toml.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "napd.toml")
}

// loadNames loads path and returns its models' names.
func loadNames(t *testing.T, path string) (*Config, []string) {
	t.Helper()
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range cfg.Models {
		names = append(names, m.Name)
	}
	return cfg, names
}

func loadProblems(t *testing.T, path string) Errors {
	t.Helper()
	_, err := Load(path)
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Load error = %v, want Errors", err)
	}
	return errs
}

// hasProblem reports whether one problem is in file at line, with key and
// a message holding msg.
func hasProblem(errs Errors, file string, line int, key, msg string) bool {
	return slices.ContainsFunc(errs, func(p Problem) bool {
		return p.File == file && p.Line == line && p.Key == key && strings.Contains(p.Message, msg)
	})
}

func TestLoad_DropInsInLexicalOrderAfterTheMainFile(t *testing.T) {
	path := writeTree(t, map[string]string{
		"napd.toml":                  "[models.main]\n" + minimal,
		"napd.d/20-b.toml":           "[models.b]\n" + minimal + "aliases = [\"bee\"]\n",
		"napd.d/10-a.toml":           "[templates.t]\n" + minimal + "[models.a]\ntemplate = \"t\"\n",
		"napd.d/README":              "not toml",
		"napd.d/30-c.toml~":          "[models.backup]\n" + minimal,
		"napd.d/.hidden.toml":        "[models.hidden]\n" + minimal,
		"napd.d/.#30-c.toml":         "[models.lock]\n" + minimal,
		"napd.d/40-d.toml.dpkg-old":  "[models.old]\n" + minimal,
		"napd.d/40-d.toml.dpkg-new":  "[models.new]\n" + minimal,
		"napd.d/40-d.toml.dpkg-dist": "[models.dist]\n" + minimal,
	})
	cfg, names := loadNames(t, path)
	if want := []string{"main", "a", "b"}; !slices.Equal(names, want) {
		t.Errorf("models %v, want %v", names, want)
	}
	dir := filepath.Join(filepath.Dir(path), "napd.d")
	if want := []string{filepath.Join(dir, "10-a.toml"), filepath.Join(dir, "20-b.toml")}; !slices.Equal(cfg.DropIns, want) {
		t.Errorf("drop-ins %v, want %v", cfg.DropIns, want)
	}
	if cfg.DropInDir() != dir {
		t.Errorf("DropInDir = %s, want %s", cfg.DropInDir(), dir)
	}
}

func TestLoad_DropInProblems(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		file  string // relative; "" = napd.toml
		line  int
		key   string
		msg   string
	}{
		{"model defined twice", map[string]string{
			"napd.toml":       "\n[models.a]\n" + minimal,
			"napd.d/a.toml":   "[models.x]\n" + minimal,
			"napd.d/b/x.toml": "",
			"napd.d/z.toml":   "\n\n[models.a]\n" + minimal,
		}, "napd.d/z.toml", 3, "models.a", "model a is already defined at %DIR%/napd.toml:2"},
		{"alias defined twice", map[string]string{
			"napd.toml":     "[models.a]\n" + minimal + "aliases = [\"x\"]\n",
			"napd.d/b.toml": "[models.b]\n" + minimal + "aliases = [\"x\"]\n",
		}, "napd.d/b.toml", 3, "models.b.aliases", `alias "x" is already an alias of model a (%DIR%/napd.toml:3)`},
		{"template defined twice", map[string]string{
			"napd.toml":     "[templates.t]\nport = 1\n",
			"napd.d/b.toml": "[templates.t]\nport = 2\n",
		}, "napd.d/b.toml", 1, "templates.t", "template t is already defined at %DIR%/napd.toml:1"},
		{"[agent] in a drop-in", map[string]string{
			"napd.toml": "", "napd.d/b.toml": "[models.b]\n" + minimal + "[agent]\nlog_level = \"debug\"\n",
		}, "napd.d/b.toml", 3, "agent", "[agent] belongs in the main file"},
		{"[gateway] in a drop-in", map[string]string{"napd.toml": "", "napd.d/b.toml": "[gateway]\n"}, "napd.d/b.toml", 1, "gateway", "belongs in the main file"},
		{"[policy] in a drop-in", map[string]string{"napd.toml": "", "napd.d/b.toml": "[policy]\n"}, "napd.d/b.toml", 1, "policy", "belongs in the main file"},
		{"[pressure] in a drop-in", map[string]string{"napd.toml": "", "napd.d/b.toml": "[pressure]\n"}, "napd.d/b.toml", 1, "pressure", "belongs in the main file"},
		{"unknown table in a drop-in", map[string]string{"napd.toml": "", "napd.d/b.toml": "[modles.x]\n"}, "napd.d/b.toml", 1, "modles", "a drop-in holds"},
		{"syntax error in a drop-in", map[string]string{"napd.toml": "", "napd.d/b.toml": "[models.b]\ncommand = [\n"}, "napd.d/b.toml", 2, "", ""},
		{"bad value in a drop-in", map[string]string{"napd.toml": "", "napd.d/b.toml": "[models.b]\n" + minimal + "sleep = \"x\"\n"}, "napd.d/b.toml", 3, "models.b.sleep", "unknown value"},
		{"set include_dir missing", map[string]string{"napd.toml": "[agent]\ninclude_dir = \"conf.d\"\n"}, "", 2, "agent.include_dir", "no such file"},
		{"include_dir a file", map[string]string{"napd.toml": "", "napd.d": "x"}, "", 0, "agent.include_dir", "not a directory"},
		{"a drop-in that is a directory", map[string]string{"napd.toml": "", "napd.d/x.toml/y": ""}, "napd.d/x.toml", 0, "", "not a regular file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeTree(t, c.files)
			dir := filepath.Dir(path)
			file := path
			if c.file != "" {
				file = filepath.Join(dir, c.file)
			}
			errs := loadProblems(t, path)
			if !hasProblem(errs, file, c.line, c.key, strings.ReplaceAll(c.msg, "%DIR%", dir)) {
				t.Errorf("want %s:%d: %s: %s; got\n%v", file, c.line, c.key, c.msg, errs)
			}
		})
	}
}

func TestLoad_IncludeDir(t *testing.T) {
	abs := t.TempDir()
	if err := os.WriteFile(filepath.Join(abs, "x.toml"), []byte("[models.x]\n"+minimal), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, main string
		want       []string
	}{
		{"default beside the main file", "", []string{"d"}},
		{"relative", "[agent]\ninclude_dir = \"other.d\"\n", []string{"o"}},
		{"absolute", "[agent]\ninclude_dir = \"" + abs + "\"\n", []string{"x"}},
		{"off", "[agent]\ninclude_dir = \"\"\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeTree(t, map[string]string{
				"napd.toml":        c.main,
				"napd.d/d.toml":    "[models.d]\n" + minimal,
				"other.d/o.toml":   "[models.o]\n" + minimal,
				"other.d/o.toml.x": "[models.skipped]\n" + minimal,
			})
			if _, names := loadNames(t, path); !slices.Equal(names, c.want) {
				t.Errorf("models %v, want %v", names, c.want)
			}
		})
	}
	// The default directory may be missing.
	if _, err := Load(writeTree(t, map[string]string{"napd.toml": ""})); err != nil {
		t.Errorf("no napd.d: %v", err)
	}
}

// A drop-in or a directory that another user may write could plant a
// command napd runs: refused.
func TestLoad_DropInsOthersMayWriteAreRefused(t *testing.T) {
	path := writeTree(t, map[string]string{"napd.toml": "", "napd.d/a.toml": "[models.a]\n" + minimal})
	dir := filepath.Join(filepath.Dir(path), "napd.d")
	file := filepath.Join(dir, "a.toml")
	if err := os.Chmod(file, 0o666); err != nil {
		t.Fatal(err)
	}
	if errs := loadProblems(t, path); !hasProblem(errs, file, 0, "", "mode -rw-rw-rw-") {
		t.Errorf("group- and world-writable drop-in: %v", errs)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if errs := loadProblems(t, path); !hasProblem(errs, path, 0, "agent.include_dir", "may write it") {
		t.Errorf("world-writable directory: %v", errs)
	}
}

func TestLoad_DropInLimits(t *testing.T) {
	files := map[string]string{"napd.toml": ""}
	for i := range MaxDropIns + 1 {
		files[fmt.Sprintf("napd.d/%03d.toml", i)] = ""
	}
	path := writeTree(t, files)
	if errs := loadProblems(t, path); !hasProblem(errs, path, 0, "agent.include_dir", fmt.Sprintf("more than %d", MaxDropIns)) {
		t.Errorf("too many drop-ins: %v", errs)
	}

	// Sparse files: their size counts, nothing is read.
	path = writeTree(t, map[string]string{"napd.toml": ""})
	dir := filepath.Join(filepath.Dir(path), "napd.d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range MaxDropInBytes/MaxFileSize + 1 {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%d.toml", i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(MaxFileSize); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if errs := loadProblems(t, path); !hasProblem(errs, path, 0, "agent.include_dir", "more than 16 MiB") {
		t.Errorf("drop-ins too large together: %v", errs)
	}
}
