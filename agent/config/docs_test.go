package config

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocs_EveryKeyDocumented keeps the operator's references in step with
// the parser: every key napd accepts appears in docs/config.md's tables, in
// the shipped napd.toml (set or commented out) and in napd.toml(5), and the
// reference documents no key the parser would refuse.
func TestDocs_EveryKeyDocumented(t *testing.T) {
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	reference, shipped, man := read("docs/config.md"), read("etc/napd/napd.toml"), read("packaging/man/napd.toml.5")

	var m Model
	var pol Policy
	tables := map[string][]string{
		"agent":    keysOf(agentSchema(&Agent{})),
		"gateway":  keysOf(gatewaySchema(&Gateway{})),
		"policy":   keysOf(policyTableSchema(&Policy{})),
		"pressure": keysOf(pressureSchema(&Pressure{})),
		"models":   keysOf(withMeta(modelSchema(&m, &pol))),
	}
	documented := docTableKeys(reference)
	for table, keys := range tables {
		for _, k := range keys {
			if !slices.Contains(documented[table], k) {
				t.Errorf("docs/config.md: [%s] %s is not in its table", table, k)
			}
			if !regexp.MustCompile(`(?m)^#?`+regexp.QuoteMeta(k)+` = `).MatchString(shipped) &&
				!(table == "models" && slices.Contains(tables["policy"], k)) {
				t.Errorf("etc/napd/napd.toml: %s.%s is not shown", table, k)
			}
			if !strings.Contains(strings.ReplaceAll(man, `\-`, "-"), k) {
				t.Errorf("napd.toml(5): %s.%s is not described", table, k)
			}
		}
		for _, k := range documented[table] {
			if !slices.Contains(keys, k) {
				t.Errorf("docs/config.md documents [%s] %s, which napd does not accept", table, k)
			}
		}
	}
}

// TestDocs_DeprecatedKeysSaySo: each key napd accepts only to warn about
// is described as deprecated where an operator looks it up, and the
// shipped napd.toml no longer sets it.
func TestDocs_DeprecatedKeysSaySo(t *testing.T) {
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", rel))
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(b), `\-`, "-")
	}
	files := map[string]string{}
	for _, f := range []string{"docs/config.md", "etc/napd/napd.toml", "packaging/man/napd.toml.5", "CHANGELOG.md"} {
		files[f] = read(f)
	}
	for key := range deprecatedKeys {
		_, name, _ := strings.Cut(key, ".")
		for f, text := range files {
			if !regexp.MustCompile(`(?s)` + regexp.QuoteMeta(name) + `.{0,300}deprecated|deprecated.{0,300}` + regexp.QuoteMeta(name)).MatchString(text) {
				t.Errorf("%s does not say that %s is deprecated", f, key)
			}
		}
		if regexp.MustCompile(`(?m)^#?` + regexp.QuoteMeta(name) + ` = `).MatchString(files["etc/napd/napd.toml"]) {
			t.Errorf("etc/napd/napd.toml still shows %s", key)
		}
	}
}

func keysOf(schema map[string]setter) []string {
	keys := make([]string, 0, len(schema))
	for k := range schema {
		keys = append(keys, k)
	}
	return keys
}

// docTableKeys reads the first column of each "## `[table]`" section's key
// table in docs/config.md ("`a`, `b`" cells name several keys).
func docTableKeys(md string) map[string][]string {
	section := regexp.MustCompile("^## `\\[([a-z]+)")
	cell := regexp.MustCompile("`([a-z0-9_]+)`")
	out := map[string][]string{}
	table := ""
	for line := range strings.Lines(md) {
		if s := section.FindStringSubmatch(line); s != nil {
			table = s[1]
			continue
		}
		if strings.HasPrefix(line, "## ") {
			table = ""
		}
		if table == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, c := range cell.FindAllStringSubmatch(first, -1) {
			out[table] = append(out[table], c[1])
		}
	}
	return out
}
