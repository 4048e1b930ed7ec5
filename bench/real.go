package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The real-engine comparison: llama.cpp's llama-server on a small GGUF
// as a napd model, measured by wrk straight, through nginx and through
// napd, as the wrk comparison measures the bench engine. Its engine costs
// far more per request than the bench engine, as real ones do, so what a
// proxy costs shows as it would in front of one. Nothing of llama.cpp is
// in the repository: the bench takes the binary's and the model's paths.
const (
	realModel = "llama"
	realPath  = "/v1/completions"
	// One token: the random model's long outputs can end in llama.cpp's
	// own 500 ("does not match the expected Content-only format").
	realBody  = `{"model":"llama","prompt":"hi","max_tokens":1}`
	realConns = 4 // llama-server's -np: one slot per connection
	// napd's × direct at most this far below nginx's, at each count.
	targetRealNginx = 0.05
)

// realEngine is llama-server and the GGUF it serves.
type realEngine struct{ server, gguf string }

// newRealEngine checks -llama-server and -gguf: both or neither (nil, no
// error), each an existing file.
func newRealEngine(server, gguf string) (*realEngine, error) {
	if server == "" && gguf == "" {
		return nil, nil
	}
	if server == "" || gguf == "" {
		return nil, errors.New("-llama-server and -gguf go together: the real-engine table needs both")
	}
	var e realEngine
	for _, p := range []struct {
		flag, path string
		to         *string
	}{{"-llama-server", server, &e.server}, {"-gguf", gguf, &e.gguf}} {
		abs, err := filepath.Abs(p.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.flag, err)
		}
		st, err := os.Stat(abs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.flag, err)
		}
		if st.IsDir() {
			return nil, fmt.Errorf("%s: %s is a directory", p.flag, abs)
		}
		*p.to = abs
	}
	return &e, nil
}

// command is the engine's argv in napd's config: one generating thread,
// a slot per connection of the larger count, no web UI.
func (e *realEngine) command() []string {
	return []string{e.server, "-m", e.gguf, "--host", "127.0.0.1", "--port", "${PORT}",
		"-c", "4096", "-np", fmt.Sprint(realConns), "-t", "1", "--no-webui", "--metrics"}
}

// version is what `llama-server --version` says of its build, "" when it
// says nothing.
func (e *realEngine) version(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, e.server, "--version").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "version:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "version:"))
		}
	}
	return ""
}

// realFigures are the real-engine comparison's figures.
type realFigures struct {
	wrkFigures
	command []string // the engine's argv, ${PORT} unreplaced
	version string   // llama-server's build
}

// noRealEngine is why the real-engine comparison is skipped without its
// flags.
const noRealEngine = "no -llama-server and -gguf given (`make bench LLAMA_SERVER=PATH GGUF=FILE`; docs/bench.md says how to build one)"

// realSection runs the comparison on llama-server e (the "llama" model of
// napd a, and of b when set), or says why it cannot.
func realSection(ctx context.Context, a, b *napd, e *realEngine) (realFigures, error) {
	if _, err := exec.LookPath("wrk"); err != nil {
		return realFigures{wrkFigures: wrkFigures{skipped: "wrk is not installed"}}, nil
	}
	f := realFigures{command: e.command(), version: e.version(ctx)}
	var err error
	f.wrkFigures, err = wrkEngine(ctx, a, b, wrkTarget{model: realModel, path: realPath, body: realBody, conns: realConns, goProxies: true})
	return f, err
}

// realMarkdown renders the real-engine comparison.
func (r *report) realMarkdown(b *strings.Builder) {
	f := r.real
	b.WriteString("## Proxy cost on a real engine: llama.cpp's llama-server\n\n")
	if f.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", f.skipped)
		b.WriteString(buildLlama)
		return
	}
	defer b.WriteString(buildLlama)
	fmt.Fprintf(b, `| path | connections | req/s | × direct | × nginx | median | added median | proxy CPU per request: user + system | proxy thread switches per request | engine CPU per request |
|---|---|---|---|---|---|---|---|---|---|
`)
	ng, haveNginx := f.many["nginx"]
	ng1 := f.one["nginx"]
	for _, at := range []struct {
		conns int
		res   map[string]wrkResult
		nginx wrkResult
	}{{1, f.one, ng1}, {f.conns, f.many, ng}} {
		direct := at.res["direct"]
		for _, p := range f.paths {
			x := at.res[p]
			added, vsNginx, cpu, sw, eng := "—", "", "", "", ""
			if p != "direct" {
				added = signed(x.median - direct.median)
			}
			if haveNginx {
				vsNginx = fmt.Sprintf("%.2f", x.rps/at.nginx.rps)
			}
			if c := x.cpuPer; c.total() > 0 {
				cpu = fmt.Sprintf("%s: %s + %s", us(c.total()), us(c.user), us(c.sys))
				sw = fmt.Sprintf("%.1f", x.switches)
			}
			if x.enginePer > 0 {
				eng = us(x.enginePer)
			}
			fmt.Fprintf(b, "| %s | %d | %.0f | %.2f | %s | %s | %s | %s | %s | %s |\n",
				p, at.conns, x.rps, x.rps/direct.rps, vsNginx, lat(x.median), added, cpu, sw, eng)
		}
	}
	fmt.Fprintf(b, "\n| goal | figure | |\n|---|---|---|\n")
	for _, at := range []struct {
		conns int
		res   map[string]wrkResult
	}{{1, f.one}, {f.conns, f.many}} {
		goal := fmt.Sprintf("at %d connection%s: napd's × direct within %.2f of nginx's", at.conns, plural(at.conns), targetRealNginx)
		if !haveNginx {
			fmt.Fprintf(b, "| %s | not measured: %s | |\n", goal, f.nginx)
			continue
		}
		d := at.res["direct"].rps
		napd, nginx := at.res["napd"].rps/d, at.res["nginx"].rps/d
		fmt.Fprintf(b, "| %s | napd %.2f ×, nginx %.2f × | %s |\n", goal, napd, nginx, met(napd >= nginx-targetRealNginx))
	}
	version := ""
	if f.version != "" {
		version = " (build " + f.version + ")"
	}
	fmt.Fprintf(b, `
The engine is llama.cpp's llama-server%s, run by napd as the model %q
(health = "/health", sleep = "stop"):

    %s

wrk posts `+"`%s`"+` to %s, %d times %s per path at 1 and
%d connections, the paths interleaved as above, each figure the median
round; nginx, the stock Go proxy and the Go floor are as above, and the
CPU and switch columns measured alike. One token per request: the engine's
work is its HTTP handling, a prompt of a token or two and one decoding
step, about a millisecond of CPU (the engine column), which is where a
real engine's cost lies against a proxy's tens of microseconds. The
engine ends each connection after 100 requests (`+"`Keep-Alive: max=100`"+`):
wrk, nginx and napd open another. Engine, proxy and wrk share the
machine's cores, so the engine's CPU decides the throughput; the goal
is that napd's hop costs no more than nginx's, within %.2f of direct's
throughput, measured in the same rounds. Load average when this section
started: %s.
%s
`, version, realModel, strings.Join(f.command, " "), realBody, realPath, wrkRounds, wrkDuration,
		f.conns, targetRealNginx, f.load, f.abNote())
}

// buildLlama says how to build what the real-engine table needs.
const buildLlama = "### Building llama-server for the bench\n\n" + `Nothing of llama.cpp is in this repository: build its server once by
hand and give the bench its path. From a clone of ggml-org/llama.cpp, or
of a fork that tracks it such as ngxson/llama.cpp, whose models/*.gguf
blobs may be missing (a partial clone), leave those out:

` + "```sh" + `
git -C llama.cpp archive --format=tar HEAD ':(exclude)models/*.gguf' | (mkdir -p llama && tar -x -C llama)
cd llama
cmake -B build -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release
cmake --build build --target llama-server -j2   # about 25 minutes on 2 cores
` + "```" + `

The build runs npm ci for the server's web UI, which the bench turns off
(--no-webui); build/bin/llama-server finds its lib*.so beside it. The
model: the tiny random GGUF of Ollama's tests (1.75 MB, random weights,
noise for answers), from a clone of ollama/ollama:

` + "```sh" + `
git -C ollama show 87a88cc8f:api/data/llama-2-tiny-random.gguf > tiny.gguf
make bench LLAMA_SERVER=$PWD/llama/build/bin/llama-server GGUF=$PWD/tiny.gguf
` + "```" + `

` + "`go run ./bench -bin bin -real-only -llama-server PATH -gguf FILE`" + ` runs this
table alone (about two minutes; with ` + "`-napd-b DIR`" + `, another napd beside).

`

// abNote says what the napd (B) row is, "" when there is none.
func (f *wrkFigures) abNote() string {
	for _, p := range f.paths {
		if p == napdB {
			return `
napd (B) is the napd binary of -napd-b, with the same config, in the same
rounds, on engines of its own started alike (napd refuses an engine port
another process listens on, so two napds cannot share one engine); its
engine column is its own engine's.
`
		}
	}
	return ""
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// signed renders a latency difference with its sign, as lat does.
func signed(d time.Duration) string {
	if d < 0 {
		return "−" + lat(-d)
	}
	return "+" + lat(d)
}

// lat renders a latency in µs below a millisecond, in ms above.
func lat(d time.Duration) string {
	if d < time.Millisecond && d > -time.Millisecond {
		return us(d)
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}
