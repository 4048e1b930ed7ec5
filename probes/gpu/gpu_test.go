package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const fixtures = "../testdata/nvidia-smi/"

var quiet = slog.New(slog.DiscardHandler)

const (
	uuid0 = "GPU-5d1f6a3e-8c2b-4f7e-9a1d-2b3c4d5e6f70"
	uuid1 = "GPU-a1b2c3d4-e5f6-7a8b-9c0d-e1f2a3b4c5d6"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var twoH100 = []Device{
	{Index: 0, UUID: uuid0, Name: "NVIDIA H100 80GB HBM3", Total: 81559 * mib, Used: 62071 * mib, Free: 18934 * mib, HaveMemory: true},
	{Index: 1, UUID: uuid1, Name: "NVIDIA H100 80GB HBM3", Total: 81559 * mib, Used: 1 * mib, Free: 81004 * mib, HaveMemory: true},
}

func TestParseSMIGPUs_Recorded(t *testing.T) {
	got, err := ParseSMIGPUs(readFixture(t, "gpus-2xh100.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, twoH100) {
		t.Errorf("got %+v\nwant %+v", got, twoH100)
	}
}

func TestParseSMIGPUs_NotAvailableMemory(t *testing.T) {
	got, err := ParseSMIGPUs(readFixture(t, "gpus-gb10-na.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].HaveMemory || got[0].Name != "NVIDIA GB10" {
		t.Errorf("got %+v, want one GB10 without memory figures", got)
	}
}

func TestParseSMIGPUs_NameWithComma(t *testing.T) {
	got, err := ParseSMIGPUs([]byte("3, GPU-x, Odd, Board, 100, 40, 60\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Device{Index: 3, UUID: "GPU-x", Name: "Odd, Board", Total: 100 * mib, Used: 40 * mib, Free: 60 * mib, HaveMemory: true}
	if len(got) != 1 || got[0] != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestParseSMIGPUs_Malformed(t *testing.T) {
	for _, text := range []string{
		"0, GPU-x, name, 1, 2\n",
		"x, GPU-x, name, 1, 2, 3\n",
		"-1, GPU-x, name, 1, 2, 3\n",
		"0, , name, 1, 2, 3\n",
		"0, GPU-x, name, 1.5, 2, 3\n",
		"0, GPU-x, name, -1, 2, 3\n",
		"0, GPU-x, name, 99999999999999999, 2, 3\n",
		string(readFixture(t, "no-driver.txt")),
	} {
		if got, err := ParseSMIGPUs([]byte(text)); err == nil {
			t.Errorf("ParseSMIGPUs(%q) = %+v, want an error", text, got)
		}
	}
}

func TestParseSMIApps_Recorded(t *testing.T) {
	tests := []struct {
		file string
		want []Process
	}{
		{"apps-2xh100.csv", []Process{
			{PID: 31337, GPUIndex: -1, GPUUUID: uuid0, Used: 61480 * mib, HaveUsed: true},
			{PID: 31402, GPUIndex: -1, GPUUUID: uuid0, Used: 578 * mib, HaveUsed: true},
			{PID: 40001, GPUIndex: -1, GPUUUID: uuid1},
		}},
		{"apps-insufficient-permissions.csv", []Process{
			{PID: 31337, GPUIndex: -1, GPUUUID: uuid0},
		}},
		{"apps-none.csv", nil},
	}
	for _, tt := range tests {
		got, err := ParseSMIApps(readFixture(t, tt.file))
		if err != nil {
			t.Fatalf("%s: %v", tt.file, err)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %+v\nwant %+v", tt.file, got, tt.want)
		}
	}
}

func TestParseSMIApps_Malformed(t *testing.T) {
	for _, text := range []string{
		"GPU-x, 12\n",
		", 12, 3\n",
		"GPU-x, 0, 3\n",
		"GPU-x, abc, 3\n",
		"GPU-x, 12, many\n",
	} {
		if got, err := ParseSMIApps([]byte(text)); err == nil {
			t.Errorf("ParseSMIApps(%q) = %+v, want an error", text, got)
		}
	}
}

func FuzzParseSMIGPUs(f *testing.F) {
	f.Add(readFixture(f, "gpus-2xh100.csv"))
	f.Add(readFixture(f, "gpus-gb10-na.csv"))
	f.Add(readFixture(f, "no-driver.txt"))
	f.Fuzz(func(t *testing.T, out []byte) {
		devices, err := ParseSMIGPUs(out)
		if err != nil {
			return
		}
		for _, d := range devices {
			if d.Index < 0 || d.UUID == "" || d.Total < 0 || d.Used < 0 || d.Free < 0 {
				t.Fatalf("accepted invalid device %+v", d)
			}
		}
	})
}

func FuzzParseSMIApps(f *testing.F) {
	f.Add(readFixture(f, "apps-2xh100.csv"))
	f.Add(readFixture(f, "apps-insufficient-permissions.csv"))
	f.Add(readFixture(f, "apps-none.csv"))
	f.Fuzz(func(t *testing.T, out []byte) {
		procs, err := ParseSMIApps(out)
		if err != nil {
			return
		}
		for _, p := range procs {
			if p.PID <= 0 || p.GPUUUID == "" || p.Used < 0 || (!p.HaveUsed && p.Used != 0) {
				t.Fatalf("accepted invalid process %+v", p)
			}
		}
	})
}

// fakeSMI writes an nvidia-smi script into a fresh directory that answers the
// two exact queries napd sends with the given fixtures, and puts only that
// directory on PATH.
func fakeSMI(t *testing.T, gpus, apps string) string {
	t.Helper()
	abs := func(name string) string {
		p, err := filepath.Abs(fixtures + name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	script := fmt.Sprintf(`#!/bin/sh
case "$*" in
%q) %s %q ;;
%q) %s %q ;;
*) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
`, strings.Join(smiGPUArgs, " "), catPath(t), abs(gpus), strings.Join(smiAppsArgs, " "), catPath(t), abs(apps))
	return writeSMI(t, script)
}

// catPath is cat's absolute path: the fake's PATH holds only the fake, so
// that a real nvidia-smi on a GPU host cannot answer instead.
func catPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("cat")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func writeSMI(t *testing.T, script string) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	return path
}

// failingNVML is NVML on a host without libnvidia-ml.so.1.
type failingNVML struct{ NVML }

func (failingNVML) Init() error { return errors.New("ERROR_LIBRARY_NOT_FOUND") }

func TestOpen_FallsBackToNvidiaSMIOnPath(t *testing.T) {
	fakeSMI(t, "gpus-2xh100.csv", "apps-2xh100.csv")
	probe, closeFn := open(context.Background(), failingNVML{}, quiet)
	defer closeFn()
	snap, err := probe.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Source != SourceSMI {
		t.Errorf("source = %q, want %q", snap.Source, SourceSMI)
	}
	if !reflect.DeepEqual(snap.Devices, twoH100) {
		t.Errorf("devices = %+v", snap.Devices)
	}
	wantProcs := []Process{
		{PID: 31337, GPUIndex: 0, GPUUUID: uuid0, Used: 61480 * mib, HaveUsed: true},
		{PID: 31402, GPUIndex: 0, GPUUUID: uuid0, Used: 578 * mib, HaveUsed: true},
		{PID: 40001, GPUIndex: 1, GPUUUID: uuid1},
	}
	if !reflect.DeepEqual(snap.Processes, wantProcs) {
		t.Errorf("processes = %+v\nwant %+v", snap.Processes, wantProcs)
	}
}

func TestSMI_DropsProcessOnUnknownGPU(t *testing.T) {
	fakeSMI(t, "gpus-gb10-na.csv", "apps-2xh100.csv")
	snap, err := (&SMI{Path: "nvidia-smi"}).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 1 || len(snap.Processes) != 0 {
		t.Errorf("got %+v, want one device and no processes", snap)
	}
}

func TestOpen_NoNVMLNoSMIMeansNoGPUs(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	probe, closeFn := open(context.Background(), failingNVML{}, quiet)
	defer closeFn()
	snap, err := probe.Snapshot(context.Background())
	if err != nil || snap.Source != SourceNone || len(snap.Devices) != 0 {
		t.Errorf("got %+v, %v; want an empty snapshot from %q", snap, err, SourceNone)
	}
}

func TestOpen_BrokenDriverMeansNoGPUs(t *testing.T) {
	path := writeSMI(t, "#!/bin/sh\n"+catPath(t)+" "+mustAbs(t, fixtures+"no-driver.txt")+"\nexit 9\n")
	_, err := (&SMI{Path: path}).Snapshot(context.Background())
	if err == nil || !strings.Contains(err.Error(), "couldn't communicate with the NVIDIA driver") {
		t.Errorf("err = %v, want nvidia-smi's reason", err)
	}
	probe, _ := open(context.Background(), failingNVML{}, quiet)
	if _, ok := probe.(None); !ok {
		t.Errorf("probe = %T, want None", probe)
	}
}

func TestOpen_SystemNVMLOrFallback(t *testing.T) {
	// On a host without NVIDIA libraries (CI) this must not fail or panic;
	// on a GPU host it finds NVML.
	t.Setenv("PATH", t.TempDir())
	probe, closeFn := Open(context.Background(), quiet)
	if _, err := probe.Snapshot(context.Background()); err != nil {
		t.Errorf("snapshot: %v", err)
	}
	if err := closeFn(); err != nil {
		t.Errorf("close: %v", err)
	}
}

func mustAbs(t *testing.T, p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// fakeNVML is an in-memory NVML.
type fakeNVML struct {
	devices  []fakeDevice
	inited   int
	shutdown int
}

type fakeDevice struct {
	uuid, name        string
	total, used, free uint64
	procs             []NVMLProcess
	fail              error
}

func (f *fakeNVML) Init() error               { f.inited++; return nil }
func (f *fakeNVML) Shutdown() error           { f.shutdown++; return nil }
func (f *fakeNVML) DeviceCount() (int, error) { return len(f.devices), nil }
func (f *fakeNVML) Device(i int) (NVMLDevice, error) {
	if i < 0 || i >= len(f.devices) {
		return nil, errors.New("ERROR_INVALID_ARGUMENT")
	}
	return &f.devices[i], nil
}

func (d *fakeDevice) UUID() (string, error) { return d.uuid, nil }
func (d *fakeDevice) Name() (string, error) { return d.name, nil }
func (d *fakeDevice) Memory() (uint64, uint64, uint64, error) {
	return d.total, d.used, d.free, d.fail
}
func (d *fakeDevice) ComputeProcesses() ([]NVMLProcess, error) { return d.procs, nil }

func TestNVMLProbe_Snapshot(t *testing.T) {
	lib := &fakeNVML{devices: []fakeDevice{
		{uuid: uuid0, name: "NVIDIA H200", total: 140 << 30, used: 100 << 30, free: 40 << 30,
			procs: []NVMLProcess{{PID: 10, Used: 60 << 30}, {PID: 11, Used: NVMLValueNotAvailable}}},
		{uuid: uuid1, name: "NVIDIA H200", total: 140 << 30, free: 140 << 30},
	}}
	probe, closeFn := open(context.Background(), lib, quiet)
	snap, err := probe.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := Snapshot{
		Source: SourceNVML,
		Devices: []Device{
			{Index: 0, UUID: uuid0, Name: "NVIDIA H200", Total: 140 << 30, Used: 100 << 30, Free: 40 << 30, HaveMemory: true},
			{Index: 1, UUID: uuid1, Name: "NVIDIA H200", Total: 140 << 30, Free: 140 << 30, HaveMemory: true},
		},
		Processes: []Process{
			{PID: 10, GPUIndex: 0, GPUUUID: uuid0, Used: 60 << 30, HaveUsed: true},
			{PID: 11, GPUIndex: 0, GPUUUID: uuid0},
		},
	}
	if !reflect.DeepEqual(snap, want) {
		t.Errorf("got %+v\nwant %+v", snap, want)
	}
	if d, ok := snap.Device(1); !ok || d.UUID != uuid1 {
		t.Errorf("Device(1) = %+v, %v", d, ok)
	}
	if _, ok := snap.Device(7); ok {
		t.Error("Device(7) found")
	}
	if err := closeFn(); err != nil || lib.shutdown != 1 {
		t.Errorf("close: %v, shutdown %d times", err, lib.shutdown)
	}
}

func TestNVMLProbe_DeviceErrorNamesDevice(t *testing.T) {
	lib := &fakeNVML{devices: []fakeDevice{{uuid: uuid0}, {uuid: uuid1, fail: errors.New("ERROR_GPU_IS_LOST")}}}
	p, err := OpenNVML(lib)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Snapshot(context.Background())
	if err == nil || !strings.Contains(err.Error(), "nvml device 1: memory: ERROR_GPU_IS_LOST") {
		t.Errorf("err = %v", err)
	}
}

func TestModelUsage(t *testing.T) {
	procs := []Process{
		{PID: 10, GPUIndex: 0, Used: 30 << 30, HaveUsed: true},
		{PID: 10, GPUIndex: 1, Used: 30 << 30, HaveUsed: true},
		{PID: 11, GPUIndex: 0, Used: 1 << 30, HaveUsed: true},
		{PID: 20, GPUIndex: 1, Used: 5 << 30, HaveUsed: true},
		{PID: 21, GPUIndex: 1},                                // unknown usage
		{PID: 99, GPUIndex: 0, Used: 7 << 30, HaveUsed: true}, // nobody's
	}
	got := ModelUsage(map[string][]int{
		"llama-70b": {10, 11},
		"embed":     {20, 21},
		"asleep":    {30},
	}, procs)
	want := map[string]map[int]int64{
		"llama-70b": {0: 31 << 30, 1: 30 << 30},
		"embed":     {1: 5 << 30},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
