// Package deb tests napd's Debian package: lintian, a reproducible build, and
// the whole life of the package on a real systemd (tests/systemd/box): dpkg
// -i, socket activation, a wake in its own unit, the journal, a restart under
// load, dpkg -r and dpkg --purge. docs/install.md describes what this test
// does; keep the two in step.
package deb

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/napd/napd/tests/systemd/box"
)

// buildTimeout bounds one `packaging/build-deb.sh` (a cold Go build cache on
// a busy machine takes minutes).
const buildTimeout = 10 * time.Minute

var (
	distDir string // temp dir of the shared build, removed by TestMain
	shared  struct {
		once sync.Once
		path string
		err  error
	}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "napd-deb-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	distDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// repoRoot is the source tree the package is built from.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildDeb runs packaging/build-deb.sh into dir and returns the .deb's path.
func buildDeb(root, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "packaging", "build-deb.sh"), dir)
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build-deb.sh: %w\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	deb := lines[len(lines)-1]
	if !strings.HasSuffix(deb, ".deb") {
		return "", fmt.Errorf("build-deb.sh printed %q, not a .deb path", stdout.String())
	}
	return deb, nil
}

// sharedDeb builds the package once for every test of the run.
func sharedDeb(t *testing.T) string {
	t.Helper()
	shared.once.Do(func() { shared.path, shared.err = buildDeb(repoRoot(t), distDir) })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.path
}

func TestDeb_Lintian(t *testing.T) {
	if _, err := exec.LookPath("lintian"); err != nil {
		t.Fatal("lintian not installed: run `make test-deps`")
	}
	deb := sharedDeb(t)
	out, err := exec.Command("lintian", "--fail-on", "error,warning", deb).CombinedOutput()
	if err != nil {
		t.Errorf("lintian %s: %v\n%s", filepath.Base(deb), err, out)
	}
}

// TestDeb_Contents unpacks the package and runs what it ships.
func TestDeb_Contents(t *testing.T) {
	deb := sharedDeb(t)
	root := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v: %s", err, out)
	}
	for _, p := range []string{
		"usr/bin/napd", "usr/bin/napctl", "usr/lib/napd/napd-demo-engine",
		"lib/systemd/system/napd.service", "lib/systemd/system/napd.socket",
		"etc/napd/napd.toml", "etc/napd/napd.d", "usr/share/doc/napd/migrating.md", "usr/lib/sysusers.d/napd.conf", "usr/lib/tmpfiles.d/napd.conf",
		"usr/share/doc/napd/copyright", "usr/share/doc/napd/changelog.gz", "usr/share/doc/napd/README.md",
		"usr/share/napd/grafana/napd.json",
		"usr/share/doc/napd/fleet.md", "usr/share/doc/napd/remote.md", "usr/share/doc/napd/examples/haproxy.cfg",
		"usr/share/man/man8/napd.8.gz", "usr/share/man/man8/napctl.8.gz", "usr/share/man/man5/napd.toml.5.gz",
	} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("missing from the package: /%s", p)
		}
	}
	version, err := exec.Command("dpkg-deb", "-f", deb, "Version").Output()
	if err != nil {
		t.Fatal(err)
	}
	// The programs start (a linker flag that breaks NVML's lazily bound
	// symbols would fail napd here) and the shipped config is valid.
	napd := filepath.Join(root, "usr/bin/napd")
	if out, err := exec.Command(napd, "--version").CombinedOutput(); err != nil || !strings.Contains(string(out), strings.TrimSpace(string(version))) {
		t.Errorf("napd --version: %q, %v; want the package version %s", out, err, version)
	}
	if out, err := exec.Command(napd, "--check", "--config", filepath.Join(root, "etc/napd/napd.toml")).CombinedOutput(); err != nil {
		t.Errorf("napd --check of the shipped config: %v: %s", err, out)
	}
	if out, err := exec.Command("haproxy", "-c", "-f", filepath.Join(root, "usr/share/doc/napd/examples/haproxy.cfg")).CombinedOutput(); err != nil {
		t.Errorf("haproxy -c of the shipped example (haproxy: `make test-deps`): %v: %s", err, out)
	}
	if out, err := exec.Command(filepath.Join(root, "usr/bin/napctl"), "help").CombinedOutput(); err != nil {
		t.Errorf("napctl help: %v: %s", err, out)
	}
	if out, err := exec.Command(filepath.Join(root, "usr/lib/napd/napd-demo-engine"), "--help").CombinedOutput(); err != nil && !strings.Contains(string(out), "-startup-delay") {
		t.Errorf("napd-demo-engine --help: %v: %s", err, out)
	}
}

func TestDeb_Reproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package a second time")
	}
	first := sharedDeb(t)
	second, err := buildDeb(repoRoot(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(second)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(first) != filepath.Base(second) || !bytes.Equal(a, b) {
		t.Errorf("two builds differ: %s (%d bytes) and %s (%d bytes)", first, len(a), second, len(b))
	}
}

// inBox runs commands in a box and fails the test with their output.
type inBox struct {
	t   *testing.T
	b   *box.Box
	ctx context.Context
}

// run runs argv in the box and returns its trimmed stdout; an error is fatal.
func (x *inBox) run(argv ...string) string {
	x.t.Helper()
	out, stderr, err := x.b.Run(x.ctx, argv...)
	if err != nil {
		x.t.Fatalf("%v\nstdout: %s\nstderr: %s", err, out, stderr)
	}
	return strings.TrimSpace(out)
}

// output runs argv in the box and returns its trimmed stdout, whatever its
// exit status (systemctl is-active exits 3 for "inactive").
func (x *inBox) output(argv ...string) string {
	out, _, _ := x.b.Run(x.ctx, argv...)
	return strings.TrimSpace(out)
}

// eventually polls cond (bounded) until it holds; cond says what it saw.
func (x *inBox) eventually(what string, cond func() (bool, string)) {
	x.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || x.ctx.Err() != nil {
			x.t.Fatalf("%s: not after 30s; last saw: %s", what, saw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// napdPaths lists every file in the box whose name mentions napd, outside
// the box's shared dir.
func (x *inBox) napdPaths() []string {
	out := x.output("find", "/etc", "/usr", "/var", "/run", "-name", "*napd*", "-not", "-path", box.SharedPath+"/*")
	return strings.Fields(out)
}

const chatRequest = `{"model":"demo","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`

// testConfig is the /etc/napd/napd.toml of the test, and testDropIn its
// /etc/napd/napd.d/demo.toml: one demo model in a systemd unit of its own.
// The idle timeout is short, but longer than the test keeps the model
// busy, so that dpkg -r finds the engine running.
const testConfig = `[agent]
supervisor = "systemd"
metrics_listen = ""
`

const testDropIn = `[models.demo]
command = ["/usr/lib/napd/napd-demo-engine", "--port", "${PORT}", "--model", "${MODEL}", "--startup-delay", "200ms"]
sleep = "stop"
idle_timeout = "2m"
`

// clientScript sends chat requests in a loop, one result a line in $1
// (the HTTP status, or "000 curl-exit-N" when curl failed: 7 is a refused
// connection), until $2 exists or $3 requests were sent.
const clientScript = `#!/bin/sh
i=0
while [ ! -e "$2" ] && [ "$i" -lt "$3" ]; do
	code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 60 -X POST \
		-H 'Content-Type: application/json' -d '` + chatRequest + `' \
		http://127.0.0.1:8080/v1/chat/completions 2>/dev/null) || code="$code curl-exit-$?"
	echo "$code" >>"$1"
	i=$((i + 1))
done
`

func TestDeb_InstallActivateRestartPurge(t *testing.T) {
	b := box.BootWith(t, box.Options{PackageUnitDirs: true})
	deb := sharedDeb(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	x := &inBox{t: t, b: b, ctx: ctx}
	t.Cleanup(func() {
		if t.Failed() {
			out, _, _ := b.Run(context.Background(), "journalctl", "--no-pager", "-u", "napd", "-u", "napd-engine-demo", "-n", "100")
			t.Logf("journal of napd and its engine:\n%s", out)
			out, _, _ = b.Run(context.Background(), "napctl", "status")
			t.Logf("napctl status:\n%s", out)
		}
	})

	before := x.napdPaths()
	data, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	boxDeb := box.SharedPath + "/" + filepath.Base(deb)
	if err := os.WriteFile(filepath.Join(b.Shared(), filepath.Base(deb)), data, 0o644); err != nil {
		t.Fatal(err)
	}

	// dpkg -i: the socket listens, napd does not run yet.
	x.run("env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "-i", boxDeb)
	if got := x.output("systemctl", "is-active", "napd.socket"); got != "active" {
		t.Fatalf("napd.socket after install: %q, want active", got)
	}
	if got := x.output("systemctl", "is-enabled", "napd.socket"); got != "enabled" {
		t.Errorf("napd.socket enablement: %q, want enabled", got)
	}
	if got := x.run("ss", "-Hltn", "sport = :8080"); !strings.Contains(got, "127.0.0.1:8080") {
		t.Fatalf("nothing listens on 127.0.0.1:8080: %q", got)
	}
	if got := x.output("systemctl", "is-active", "napd.service"); got == "active" {
		t.Fatalf("napd.service runs before any request")
	}
	if got := x.run("dpkg-query", "-W", "-f=${Conffiles}", "napd"); !strings.Contains(got, "/etc/napd/napd.toml") {
		t.Errorf("conffiles: %q, want /etc/napd/napd.toml", got)
	}
	x.run("getent", "group", "napd")
	x.run("getent", "passwd", "napd-engine")
	if got := x.run("stat", "-c", "%U:%G %a", "/var/lib/napd", "/run/napd"); got != "root:napd 750\nroot:napd 750" {
		t.Errorf("state and runtime dirs: %q, want root:napd 750", got)
	}

	// The drop-in directory is shipped empty, owned and moded as /etc/napd.
	if got := x.run("stat", "-c", "%U:%G %a", "/etc/napd", "/etc/napd/napd.d"); got != "root:root 755\nroot:root 755" {
		t.Errorf("/etc/napd and /etc/napd/napd.d: %q, want root:root 755", got)
	}
	if got := x.run("ls", "-A", "/etc/napd/napd.d"); got != "" {
		t.Errorf("/etc/napd/napd.d is not empty: %q", got)
	}

	// The shipped config passes napd --check; then the test's config, its
	// model in a drop-in.
	x.run("napd", "--check", "--config", "/etc/napd/napd.toml")
	if err := os.WriteFile(b.Path("/etc/napd/napd.toml"), []byte(testConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.Path("/etc/napd/napd.d/demo.toml"), []byte(testDropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := x.run("napd", "--check", "--config", "/etc/napd/napd.toml"); !strings.Contains(got, "ok (1 models, 1 drop-ins)") {
		t.Errorf("napd --check with the drop-in: %q", got)
	}

	// A request starts napd through the socket; napd wakes the model in
	// its own unit and answers.
	out := x.run("curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}", "-X", "POST",
		"-H", "Content-Type: application/json", "-d", chatRequest,
		"http://127.0.0.1:8080/v1/chat/completions")
	if !strings.HasSuffix(out, "\n200") {
		t.Fatalf("first request: %q, want status 200", out)
	}
	if got := x.output("systemctl", "is-active", "napd.service"); got != "active" {
		t.Fatalf("napd.service after the first request: %q, want active", got)
	}
	if got := x.output("systemctl", "is-active", "napd-engine-demo.service"); got != "active" {
		t.Fatalf("napd-engine-demo.service: %q, want active", got)
	}
	if got := x.output("systemctl", "show", "-p", "User", "--value", "napd-engine-demo.service"); got != "napd-engine" {
		t.Errorf("engine unit runs as %q, want napd-engine (the default user of the package)", got)
	}
	status := x.output("systemctl", "status", "--no-pager", "napd.service")
	if !strings.Contains(status, "Active: active (running)") || !strings.Contains(status, "Status: \"") {
		t.Errorf("systemctl status napd: want active (running) with a Status line:\n%s", status)
	}
	if got := x.run("napctl", "status"); !strings.Contains(got, "demo") {
		t.Errorf("napctl status does not show the demo model:\n%s", got)
	}

	// A transcription upload whose model field follows a 1 MiB file: napd
	// spools what comes before the field to an unnamed file in its private
	// /tmp, which the hardened unit (ProtectSystem=strict, PrivateTmp=yes)
	// must let it write.
	x.run("sh", "-c", "head -c 1048576 /dev/zero > /root/speech.wav")
	out = x.run("curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}",
		"-F", "file=@/root/speech.wav", "-F", "model=demo", "http://127.0.0.1:8080/v1/audio/transcriptions")
	if !strings.HasSuffix(out, "\n200") || !strings.Contains(out, "speech.wav: 1048576 bytes") {
		t.Errorf("multipart upload under the unit: %q, want 200 with the file's size", out)
	}

	// The wake is in the journal as structured entries.
	x.eventually("journal entries for the wake of demo with STATE and REASON", func() (bool, string) {
		out := x.output("journalctl", "--no-pager", "-u", "napd", "MODEL=demo", "-o", "json")
		return wakeLogged(out), out
	})

	x.restartUnderLoad()

	// Installing the package again runs postinst as an upgrade: napd
	// restarts, the socket stays, the edited conffile is kept.
	pid := x.output("systemctl", "show", "-p", "MainPID", "--value", "napd.service")
	x.run("env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "-i", boxDeb)
	if got := x.output("systemctl", "show", "-p", "MainPID", "--value", "napd.service"); got == pid || got == "0" {
		t.Errorf("napd not restarted by the upgrade: MainPID %s, then %s", pid, got)
	}
	if got := x.output("systemctl", "is-active", "napd.socket"); got != "active" {
		t.Errorf("napd.socket after the upgrade: %q, want active", got)
	}
	if got, err := os.ReadFile(b.Path("/etc/napd/napd.toml")); err != nil || string(got) != testConfig {
		t.Errorf("edited /etc/napd/napd.toml not kept by the upgrade: %v\n%s", err, got)
	}
	if got, err := os.ReadFile(b.Path("/etc/napd/napd.d/demo.toml")); err != nil || string(got) != testDropIn {
		t.Errorf("drop-in not kept by the upgrade: %v\n%s", err, got)
	}

	// dpkg -r: napd and its engines stop; the conffile stays.
	x.run("env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "-r", "napd")
	for _, u := range []string{"napd.socket", "napd.service", "napd-engine-demo.service"} {
		if got := x.output("systemctl", "is-active", u); got == "active" || got == "activating" || got == "deactivating" {
			t.Errorf("%s after dpkg -r: %s", u, got)
		}
	}
	if got := x.output("ss", "-Hltn", "sport = :8080"); got != "" {
		t.Errorf("port 8080 still listening after dpkg -r: %q", got)
	}
	x.run("test", "-f", "/etc/napd/napd.toml")
	x.run("test", "-f", "/etc/napd/napd.d/demo.toml")
	x.run("test", "!", "-e", "/usr/bin/napd")

	// dpkg --purge: nothing of napd is left.
	x.run("env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "--purge", "napd")
	if _, _, err := b.Run(ctx, "dpkg", "-L", "napd"); err == nil {
		t.Errorf("dpkg -L napd still lists files after purge")
	}
	// systemd deletes a stopped transient unit's file when it collects the
	// unit, soon after the stop rather than at once.
	x.eventually("no napd file left after purge", func() (bool, string) {
		after := x.napdPaths()
		return slices.Equal(before, after), fmt.Sprintf("before install: %q, after purge: %q", before, after)
	})
	for _, p := range []string{"/etc/napd", "/var/lib/napd", "/var/lib/napd-engine", "/run/napd", "/usr/lib/napd"} {
		if _, err := os.Lstat(b.Path(p)); !os.IsNotExist(err) {
			t.Errorf("%s left after purge (%v)", p, err)
		}
	}
}

// wakeLogged reports whether journalctl -o json output holds an entry with
// STATE and REASON for the model and one saying it is awake.
func wakeLogged(jsonLines string) bool {
	var withReason, awake bool
	sc := bufio.NewScanner(strings.NewReader(jsonLines))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		state, _ := e["STATE"].(string)
		reason, _ := e["REASON"].(string)
		if state != "" && reason != "" {
			withReason = true
		}
		if state == "awake" {
			awake = true
		}
	}
	return withReason && awake
}

// restartUnderLoad restarts napd twice while clients send requests in a
// loop: every request must succeed (the socket queues connections while
// napd restarts) and the engine must keep running in its unit.
func (x *inBox) restartUnderLoad() {
	x.t.Helper()
	const clients = 4
	shared := x.b.Shared()
	if err := os.WriteFile(filepath.Join(shared, "client.sh"), []byte(clientScript), 0o755); err != nil {
		x.t.Fatal(err)
	}
	stop := box.SharedPath + "/stop"
	engine := x.output("systemctl", "show", "-p", "InvocationID", "--value", "napd-engine-demo.service")

	var wg sync.WaitGroup
	errs := make([]error, clients)
	for i := range clients {
		cmd := x.b.Command(x.ctx, "sh", box.SharedPath+"/client.sh", fmt.Sprintf("%s/client%d.log", box.SharedPath, i), stop, "5000")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("client %d: %w: %s", i, err, out)
			}
		}()
	}
	results := func() [][]string {
		all := make([][]string, clients)
		for i := range clients {
			data, _ := os.ReadFile(filepath.Join(shared, fmt.Sprintf("client%d.log", i)))
			all[i] = strings.Fields(strings.ReplaceAll(string(data), " ", "_"))
		}
		return all
	}
	// waitEach waits until every client has sent n more requests.
	waitEach := func(what string, n int) {
		base := results()
		x.eventually(what, func() (bool, string) {
			now := results()
			for i := range now {
				if len(now[i]) < len(base[i])+n {
					return false, fmt.Sprintf("client %d sent %d", i, len(now[i])-len(base[i]))
				}
			}
			return true, ""
		})
	}
	waitEach("clients running before the restart", 3)
	for range 2 {
		x.run("systemctl", "restart", "napd.service")
		waitEach("clients served after a restart", 3)
	}
	if err := os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644); err != nil {
		x.t.Fatal(err)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			x.t.Error(err)
		}
	}
	total, failed := 0, map[string]int{}
	for _, codes := range results() {
		for _, c := range codes {
			total++
			if c != "200" {
				failed[c]++
			}
		}
	}
	if len(failed) > 0 {
		x.t.Errorf("restart under load: %v of %d requests failed (000_curl-exit-7 is a refused connection)", failed, total)
	} else {
		x.t.Logf("restart under load: %d requests, all 200", total)
	}
	if got := x.output("systemctl", "show", "-p", "InvocationID", "--value", "napd-engine-demo.service"); got != engine {
		x.t.Errorf("engine unit restarted with napd: invocation %q, then %q", engine, got)
	}
}
