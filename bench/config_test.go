package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/napd/napd/agent/config"
)

// parseConfig is napd's own reading of the config n's models make.
func parseConfig(t *testing.T, n *napd, ms []engineModel) *config.Config {
	t.Helper()
	cfg, err := n.configure(ms)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(filepath.Join(n.dir, "napd.toml"), []byte(cfg))
	if err != nil {
		t.Fatalf("napd refuses the bench's config: %v\n%s", err, cfg)
	}
	return c
}

func testNapd(t *testing.T, name string) *napd {
	t.Helper()
	n, err := newNapd(name, "napd-bench-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(n.dir) })
	return n
}

func modelNamed(c *config.Config, name string) *config.Model {
	for _, m := range c.Models {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// TestConfig_RealEngineAndB checks that napd reads the configs of the
// bench's napd and of napd B as meant: llama-server as the model "llama"
// on a port of its own with health = "/health", B with the wrk models
// alone on other ports.
func TestConfig_RealEngineAndB(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	real, err := newRealEngine(self, self) // any two existing files
	if err != nil {
		t.Fatal(err)
	}
	a, b := testNapd(t, "napd"), testNapd(t, napdB)
	ca := parseConfig(t, a, a.mainModels("bin", self, real))
	cb := parseConfig(t, b, wrkModels(self, real))

	var names []string
	for _, m := range cb.Models {
		names = append(names, m.Name)
	}
	if want := []string{"proxy", "proxy1", realModel}; !slices.Equal(names, want) {
		t.Errorf("napd B's models: %v, want %v", names, want)
	}
	if len(ca.Models) != 4+len(wakeDelays) {
		t.Errorf("napd A has %d models, want the wrk models, demo and %d wake models", len(ca.Models), len(wakeDelays))
	}
	for _, c := range []struct {
		cfg *config.Config
		n   *napd
	}{{ca, a}, {cb, b}} {
		m := modelNamed(c.cfg, realModel)
		if m == nil {
			t.Fatalf("%s: no model %q", c.n.name, realModel)
		}
		if !slices.Equal(m.Command, real.command()) || m.Health != "/health" {
			t.Errorf("%s: llama model %v health %q, want %v and /health", c.n.name, m.Command, m.Health, real.command())
		}
		if m.Port == 0 || m.Port != c.n.engines[realModel] {
			t.Errorf("%s: llama's port %d, the bench's %d", c.n.name, m.Port, c.n.engines[realModel])
		}
	}
	for _, model := range []string{"proxy", "proxy1", realModel} {
		if a.engines[model] == b.engines[model] {
			t.Errorf("%s: napd A and B share engine port %d", model, a.engines[model])
		}
	}
}

// TestConfig_Scale checks the scale napd's config: scaleModels models on
// ports napd picks.
func TestConfig_Scale(t *testing.T) {
	n := testNapd(t, "napd")
	c := parseConfig(t, n, scaleModelList("/bin/true"))
	if len(c.Models) != scaleModels {
		t.Fatalf("%d models, want %d", len(c.Models), scaleModels)
	}
	for _, m := range c.Models {
		if m.Port != 0 {
			t.Fatalf("%s: port %d, want 0 (napd picks)", m.Name, m.Port)
		}
	}
}

func TestNewRealEngine(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if e, err := newRealEngine("", ""); e != nil || err != nil {
		t.Errorf("no flags: %v, %v; want neither an engine nor an error", e, err)
	}
	for _, c := range [][2]string{{self, ""}, {"", self}, {self, filepath.Join(t.TempDir(), "missing.gguf")}, {t.TempDir(), self}} {
		if _, err := newRealEngine(c[0], c[1]); err == nil {
			t.Errorf("-llama-server %q -gguf %q: no error", c[0], c[1])
		}
	}
}
