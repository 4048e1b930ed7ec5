package main

import (
	"os/exec"
	"strings"
	"testing"
)

// napctl and the demo engine read napd's config (agent/config) but are not
// proxies: they must not link the gateway or its HTTP stack, which
// agent/config once pulled in to check upstream_deny entries.
func TestDeps_NoGatewayInTheTools(t *testing.T) {
	for _, pkg := range []string{"github.com/napd/napd/cmd/napctl", "github.com/napd/napd/cmd/napd-demo-engine"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for dep := range strings.Lines(string(out)) {
			switch dep = strings.TrimSpace(dep); dep {
			case "github.com/napd/napd/gateway", "github.com/napd/napd/internal/h1":
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
