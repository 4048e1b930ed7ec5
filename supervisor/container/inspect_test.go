package container

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napd/napd/supervisor"
)

func readInspect(t *testing.T, name string) inspected {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseInspect(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%s: %d containers", name, len(got))
	}
	return got[0]
}

// Recorded answers of podman 4.3 and docker 20.10 (this repository's test
// machines): what napd reads of a running, an exited, a published
// container, and of one whose start failed for want of a GPU runtime.
func TestParseInspect_Recorded(t *testing.T) {
	for _, c := range []struct {
		file, name, model, ip, reason string
		state                         supervisor.ProcState
		pid, conmon                   bool
	}{
		{"podman-inspect-running.json", "napd-engine-t1", "t1", "", "", supervisor.ProcRunning, true, true},
		{"podman-inspect-exited.json", "napd-engine-t1", "t1", "", "exit code 0", supervisor.ProcFailed, false, false},
		{"podman-inspect-published.json", "napd-engine-t2", "", "10.88.0.5", "", supervisor.ProcRunning, true, true},
		{"docker-inspect-running.json", "napd-engine-d1", "d1", "", "", supervisor.ProcRunning, true, false},
		{"docker-inspect-exited.json", "napd-engine-d1", "d1", "", "exit code 0", supervisor.ProcFailed, false, false},
		{"docker-inspect-published.json", "d4", "", "172.17.0.2", "", supervisor.ProcRunning, true, false},
		{"docker-inspect-nogpu.json", "napd-engine-g1", "g1", "", `never started: could not select device driver "" with capabilities: [[gpu]]`, supervisor.ProcStarting, false, false},
	} {
		t.Run(c.file, func(t *testing.T) {
			f := readInspect(t, c.file)
			if f.Name != c.name || f.model("abc") != c.model || f.NetworkSettings.IPAddress != c.ip || f.procState() != c.state ||
				(f.State.Pid > 0) != c.pid || (f.State.ConmonPid > 0) != c.conmon || len(f.ID) != 64 {
				t.Errorf("got name %q model %q ip %q state %s pid %d conmon %d id %q", f.Name, f.model("abc"), f.NetworkSettings.IPAddress,
					f.procState(), f.State.Pid, f.State.ConmonPid, f.ID)
			}
			if c.reason != "" && f.exitReason() != c.reason {
				t.Errorf("reason %q, want %q", f.exitReason(), c.reason)
			}
			if f.model("another") != "" {
				t.Error("another instance's container taken for this napd's")
			}
		})
	}
	if p := readInspect(t, "podman-inspect-running.json"); !strings.HasSuffix(p.ConmonPidFile, "/userdata/conmon.pid") {
		t.Errorf("podman's conmon PID file: %q", p.ConmonPidFile)
	}
}

func TestExitReason(t *testing.T) {
	var c inspected
	c.State.Status, c.State.ExitCode, c.State.OOMKilled = "exited", 137, true
	if got := c.exitReason(); got != "killed for want of memory (OOM)" {
		t.Errorf("OOM: %q", got)
	}
	c.State.OOMKilled, c.State.Error = false, "OCI runtime error"
	if got := c.exitReason(); got != "exit code 137: OCI runtime error" {
		t.Errorf("error: %q", got)
	}
}

func TestParseInspect_Bad(t *testing.T) {
	for _, in := range []string{"", "{}", "[{}]", "[1]", `[{"Id": 5}]`, strings.Repeat(" ", maxInspect+1)} {
		if _, err := parseInspect([]byte(in)); err == nil {
			t.Errorf("%.20q parsed", in)
		}
	}
	if got, err := parseInspect([]byte("[]")); err != nil || len(got) != 0 {
		t.Errorf("[]: %v %v", got, err)
	}
}

func FuzzParseInspect(f *testing.F) {
	for _, name := range []string{"podman-inspect-running.json", "docker-inspect-published.json", "docker-inspect-nogpu.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseInspect(data)
		if err != nil {
			return
		}
		for _, c := range got {
			if c.ID == "" || strings.HasPrefix(c.Name, "/") {
				t.Fatalf("parsed %+v", c)
			}
			_ = c.procState()
			_ = c.exitReason()
		}
	})
}

// The runtime's message is its stderr without the advice on --help; "no
// such container" from either runtime is a container that does not exist.
func TestMessageAndNotFound(t *testing.T) {
	docker := "docker: Error response from daemon: No such image: localhost/nope:1.\nSee 'docker run --help'.\n"
	if got := message([]byte(docker)); got != "docker: Error response from daemon: No such image: localhost/nope:1." {
		t.Errorf("docker: %q", got)
	}
	if got := message([]byte(strings.Repeat("x", 2*maxMessage))); len(got) > maxMessage+len("…") {
		t.Errorf("unbounded: %d bytes", len(got))
	}
	for _, msg := range []string{"Error response from daemon: No such container: nope", "Error: inspecting object: no such container nope", `Error: no such object: "x"`} {
		if !notFound(&Error{Runtime: "x", Op: "rm", Message: msg}) {
			t.Errorf("%q not taken for a missing container", msg)
		}
	}
	if notFound(&Error{Message: "Error: image not known"}) || notFound(errors.New("no such container")) {
		t.Error("other errors taken for a missing container")
	}
}
