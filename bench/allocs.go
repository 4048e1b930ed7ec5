package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// goBench is one line of `go test -bench -benchmem`.
type goBench struct {
	name     string
	nsOp     float64
	bytesOp  int64
	allocsOp int64
}

// gatewayAllocs runs the gateway's BenchmarkProxy (a loopback engine
// straight and through the gateway, in-process) for its allocations per
// request.
func gatewayAllocs(ctx context.Context) ([]goBench, error) {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	out, err := exec.CommandContext(ctx, goBin, "test", "-run", "^$", "-bench", "^BenchmarkProxy$",
		"-benchmem", "-benchtime", "2s", "./gateway").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go test -bench: %w: %s", err, out)
	}
	var bs []goBench
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || !strings.HasPrefix(f[0], "BenchmarkProxy/") || f[3] != "ns/op" || f[5] != "B/op" || f[7] != "allocs/op" {
			continue
		}
		b := goBench{name: strings.TrimPrefix(f[0], "BenchmarkProxy/")}
		b.name, _, _ = strings.Cut(b.name, "-")
		b.nsOp, _ = strconv.ParseFloat(f[2], 64)
		b.bytesOp, _ = strconv.ParseInt(f[4], 10, 64)
		b.allocsOp, _ = strconv.ParseInt(f[6], 10, 64)
		bs = append(bs, b)
	}
	if len(bs) != 2 {
		return nil, fmt.Errorf("no BenchmarkProxy figures in:\n%s", out)
	}
	return bs, nil
}

// allocsMarkdown renders the go test -benchmem figures.
func (r *report) allocsMarkdown(b *strings.Builder) {
	if len(r.allocs) != 2 {
		return
	}
	d, g := r.allocs[0], r.allocs[1]
	fmt.Fprintf(b, `Allocations per request, from `+"`go test -bench '^BenchmarkProxy$' -benchmem ./gateway`"+`
(client, gateway and engine in one process; the gateway's own models
layer is a fake, the agent's per-model loop is bounded apart):

| path | allocations | bytes | time per request (2 cores, parallel) |
|---|---|---|---|
| %s | %d | %d B | %.0f µs |
| %s | %d | %d B | %.0f µs |
| added by the gateway | %d | %d B | |

Regression guards, no timing: `+"`TestProxyAllocs`"+` (gateway/allocs_test.go:
the allocations the gateway adds per request) and `+"`TestAdmitAllocs`"+`
(agent/model/allocs_test.go: an admission and its end on an awake model).

`, d.name, d.allocsOp, d.bytesOp, d.nsOp/1000, g.name, g.allocsOp, g.bytesOp, g.nsOp/1000,
		g.allocsOp-d.allocsOp, g.bytesOp-d.bytesOp)
}
