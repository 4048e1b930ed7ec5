//go:build linux

package systemd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"

	"github.com/napd/napd/supervisor"
)

func propsSignal(unitPath, iface string, changed map[string]any) *godbus.Signal {
	m := map[string]godbus.Variant{}
	for k, v := range changed {
		m[k] = godbus.MakeVariant(v)
	}
	return &godbus.Signal{
		Name: sigPropsChg,
		Path: godbus.ObjectPath(unitNS + unitPath),
		Body: []any{iface, m, []string{}},
	}
}

const unitNS = unitPathNS + "/"

func TestTracker_FailureEventCarriesSystemdReason(t *testing.T) {
	tr := newTracker()
	now := time.Unix(100, 0)
	path := "napd_2dengine_2dllama_2eservice"
	if _, ok := tr.handle(propsSignal(path, ifaceUnit, map[string]any{"ActiveState": "inactive"}), now); ok {
		t.Fatal("event for a unit being created")
	}
	if _, ok := tr.handle(propsSignal(path, ifaceUnit, map[string]any{"ActiveState": "active"}), now); !ok {
		t.Fatal("no event for active")
	}
	// Service change first, then the Unit change of the same transition.
	if _, ok := tr.handle(propsSignal(path, ifaceService, map[string]any{
		"Result": "exit-code", "ExecMainCode": int32(cldExited), "ExecMainStatus": int32(1),
	}), now); ok {
		t.Fatal("Service change alone made an event")
	}
	ev, ok := tr.handle(propsSignal(path, ifaceUnit, map[string]any{"ActiveState": "failed", "SubState": "failed"}), now)
	want := supervisor.Event{Model: "llama", State: supervisor.ProcFailed, Reason: "exit-code (status=1)", Time: now}
	if !ok || ev != want {
		t.Fatalf("event = %+v, %v; want %+v", ev, ok, want)
	}
	// The same state again is no change.
	if _, ok := tr.handle(propsSignal(path, ifaceUnit, map[string]any{"ActiveState": "failed"}), now); ok {
		t.Error("repeated state made an event")
	}
}

func TestTracker_IgnoresForeignUnitsButWatchesOperatorUnits(t *testing.T) {
	tr := newTracker()
	sig := propsSignal("vllm_2eservice", ifaceUnit, map[string]any{"ActiveState": "active"})
	if _, ok := tr.handle(sig, time.Time{}); ok {
		t.Fatal("event for a unit napd does not know")
	}
	tr.watch(supervisor.Spec{Model: "big", Unit: "vllm.service"})
	if _, ok := tr.handle(propsSignal("vllm_2eservice", ifaceUnit, map[string]any{"ActiveState": "active"}), time.Time{}); !ok {
		t.Fatal("no event for a watched operator unit")
	}
	sig = propsSignal("vllm_2eservice", ifaceUnit, map[string]any{"ActiveState": "inactive"})
	ev, ok := tr.handle(sig, time.Time{})
	if !ok || ev.Model != "big" || ev.State != supervisor.ProcStopped || ev.Reason != "" {
		t.Fatalf("event = %+v, %v", ev, ok)
	}
}

func TestTracker_JobRemovedReachesWaiterWithExitInfo(t *testing.T) {
	tr := newTracker()
	tr.handle(propsSignal("napd_2dengine_2dx_2eservice", ifaceService, map[string]any{
		"Result": "signal", "ExecMainCode": int32(cldKilled), "ExecMainStatus": int32(9),
	}), time.Time{})
	ch := make(chan jobResult, 1)
	tr.jobs[7] = ch
	tr.handle(&godbus.Signal{Name: sigJobRemoved, Body: []any{
		uint32(7), godbus.ObjectPath("/org/freedesktop/systemd1/job/7"), "napd-engine-x.service", "failed",
	}}, time.Time{})
	select {
	case res := <-ch:
		if res.Result != "failed" || res.Exit.String() != "signal (SIGKILL)" {
			t.Fatalf("job result = %+v (%s)", res, res.Exit)
		}
	default:
		t.Fatal("waiter got nothing")
	}
	if len(tr.jobs) != 0 {
		t.Error("waiter not removed")
	}
	// A job nobody waits for is ignored.
	tr.handle(&godbus.Signal{Name: sigJobRemoved, Body: []any{
		uint32(8), godbus.ObjectPath("/org/freedesktop/systemd1/job/8"), "x.service", "done",
	}}, time.Time{})
}

func TestExitInfo_String(t *testing.T) {
	for _, c := range []struct {
		e    exitInfo
		want string
	}{
		{exitInfo{Result: "success"}, ""},
		{exitInfo{}, ""},
		{exitInfo{Result: "exit-code", Code: cldExited, Status: 3}, "exit-code (status=3)"},
		{exitInfo{Result: "core-dump", Code: cldDumped, Status: 11}, "core-dump (SIGSEGV)"},
		{exitInfo{Result: "timeout"}, "timeout"},
	} {
		if got := c.e.String(); got != c.want {
			t.Errorf("%+v = %q, want %q", c.e, got, c.want)
		}
	}
}

func TestProcState(t *testing.T) {
	for _, c := range []struct {
		load, active string
		want         supervisor.ProcState
	}{
		{"loaded", "active", supervisor.ProcRunning},
		{"loaded", "activating", supervisor.ProcStarting},
		{"loaded", "failed", supervisor.ProcFailed},
		{"loaded", "inactive", supervisor.ProcStopped},
		{"not-found", "inactive", supervisor.ProcStopped},
		{"loaded", "maintenance", supervisor.ProcUnknown},
	} {
		if got := procState(c.load, c.active); got != c.want {
			t.Errorf("procState(%s, %s) = %v, want %v", c.load, c.active, got, c.want)
		}
	}
}

func TestModelFromUnit(t *testing.T) {
	if m, ok := modelFromUnit("napd-engine-qwen-7b.service"); !ok || m != "qwen-7b" {
		t.Errorf("got %q %v", m, ok)
	}
	for _, u := range []string{"napd-engine-.service", "napd-engine-x.socket", "vllm.service"} {
		if _, ok := modelFromUnit(u); ok {
			t.Errorf("%s taken for a napd engine unit", u)
		}
	}
}

func TestTransientProperties(t *testing.T) {
	spec := supervisor.Spec{
		Model: "m", Command: []string{"/bin/engine", "--port", "8001"},
		Environment: map[string]string{"B": "2", "A": "1", "CUDA_VISIBLE_DEVICES": "9"},
		GPUs:        []int{0, 2}, WorkingDirectory: "/srv", User: "napd", StopTimeout: 1500 * time.Millisecond,
	}
	got := map[string]any{}
	for _, p := range transientProperties(spec) {
		got[p.Name] = p.Value.Value()
	}
	want := map[string]any{
		"Description":      "napd engine for model m",
		"Type":             "exec",
		"KillMode":         "mixed",
		"CollectMode":      "inactive-or-failed",
		"MemoryAccounting": true,
		"StandardOutput":   "journal",
		"StandardError":    "journal",
		"SyslogIdentifier": "napd-engine-m",
		"WorkingDirectory": "/srv",
		"User":             "napd",
		"TimeoutStopUSec":  uint64(1500000),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if env := got["Environment"].([]string); !slices.Equal(env, []string{"A=1", "B=2", "CUDA_VISIBLE_DEVICES=0,2"}) {
		t.Errorf("Environment = %q", env)
	}
	if _, ok := got["ExecStart"]; !ok {
		t.Error("no ExecStart")
	}
	// Unset optional fields are not sent (systemd keeps its defaults).
	bare := map[string]bool{}
	for _, p := range transientProperties(supervisor.Spec{Model: "m", Command: []string{"x"}}) {
		bare[p.Name] = true
	}
	for _, k := range []string{"User", "WorkingDirectory", "TimeoutStopUSec", "Environment", "PIDFile", "ExecStop"} {
		if bare[k] {
			t.Errorf("%s sent for an empty spec", k)
		}
	}
}

// A runtime client's unit (supervisor/container): Type=forking with the
// PIDFile of the process that stays (podman's conmon), and an ExecStop
// whose failure is ignored.
func TestTransientProperties_RuntimeClient(t *testing.T) {
	spec := supervisor.Spec{
		Model: "m", Command: []string{"/usr/bin/podman", "start", "napd-engine-m"},
		PIDFile:     "/run/containers/storage/overlay-containers/1/userdata/conmon.pid",
		StopCommand: []string{"/usr/bin/podman", "stop", "-t", "30", "napd-engine-m"},
	}
	got := map[string]godbus.Variant{}
	for _, p := range transientProperties(spec) {
		got[p.Name] = p.Value
	}
	if typ := got["Type"].Value(); typ != "forking" {
		t.Errorf("Type = %v", typ)
	}
	if f := got["PIDFile"].Value(); f != spec.PIDFile {
		t.Errorf("PIDFile = %v", f)
	}
	stop, start := got["ExecStop"], got["ExecStart"]
	if stop.Signature() != start.Signature() {
		t.Fatalf("ExecStop signature %s, ExecStart's %s", stop.Signature(), start.Signature())
	}
	for _, want := range []string{"stop", "-t", "30", "napd-engine-m", "true"} {
		if !strings.Contains(stop.String(), want) {
			t.Errorf("ExecStop %s lacks %q", stop, want)
		}
	}
}

func TestProbe(t *testing.T) {
	answer := func(context.Context) (string, error) { return "running", nil }
	root := t.TempDir()
	if ok, why := probe(context.Background(), root, answer); ok || !strings.Contains(why, "/run/systemd/system") {
		t.Errorf("no /run/systemd/system: %v %q", ok, why)
	}
	must(t, os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755))
	must(t, os.MkdirAll(filepath.Join(root, "proc/1"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "proc/1/comm"), []byte("tini\n"), 0o644))
	if ok, why := probe(context.Background(), root, answer); ok || !strings.Contains(why, `"tini"`) {
		t.Errorf("PID 1 tini: %v %q", ok, why)
	}
	must(t, os.WriteFile(filepath.Join(root, "proc/1/comm"), []byte("systemd\n"), 0o644))
	if ok, why := probe(context.Background(), root, func(context.Context) (string, error) {
		return "", errors.New("no bus")
	}); ok || !strings.Contains(why, "no bus") {
		t.Errorf("no bus: %v %q", ok, why)
	}
	if ok, why := probe(context.Background(), root, answer); !ok || !strings.Contains(why, "running") {
		t.Errorf("systemd: %v %q", ok, why)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func FuzzUnescapeUnitPath(f *testing.F) {
	f.Add("napd_2dengine_2dx_2eservice")
	f.Add("a_")
	f.Add("_zz_2")
	f.Fuzz(func(t *testing.T, s string) {
		got := unescapeUnitPath(godbus.ObjectPath(unitNS + s))
		if !strings.Contains(s, "_") && got != s {
			t.Fatalf("unescape(%q) = %q, want it unchanged", s, got)
		}
		if len(got) > len(s) {
			t.Fatalf("unescape grew %q to %q", s, got)
		}
	})
}
