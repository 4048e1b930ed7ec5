package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, name := range []string{"napd.toml", "demo.toml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "etc", "napd", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("[models.a]\ncommand = [\"x\", \"${PORT}\"]\naliases = [\"a\"]\nport = 1\n[models.b]\nunit = \"b.service\"\nport = 1\n"))
	f.Add([]byte("models = { a = { unit = 1 }, \"B\" = [] }\n[[agent]]\n"))
	f.Add([]byte("[models.a.environment]\nX = \"${PORT}\"\n"))
	f.Add([]byte("[templates.t]\ncommand = [\"e\", \"${PORT}\", \"${v}\", \"$${x}\"]\nvars = { v = \"${MODEL}${SERVED_NAME}\" }\n" +
		"[templates.u]\ntemplate = \"t\"\n[models.a]\ntemplate = \"u\"\nenvironment = { E = \"${env:HOME:-x}\" }\n"))
	f.Add([]byte("[templates.a]\ntemplate = \"b\"\n[templates.b]\ntemplate = \"a\"\n[models.m]\ntemplate = \"a\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.toml", data)
		if err == nil {
			if cfg == nil {
				t.Fatal("nil config without error")
			}
			return
		}
		var errs Errors
		if errors.As(err, &errs) {
			if len(errs) == 0 {
				t.Fatal("empty Errors")
			}
			for _, p := range errs {
				if p.File != "fuzz.toml" || p.Message == "" {
					t.Fatalf("incomplete problem %+v", p)
				}
			}
		}
	})
}
