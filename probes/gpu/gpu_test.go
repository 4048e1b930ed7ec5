package gpu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/napd/napd/gpuvendor"
	"github.com/napd/napd/probes/drm"
)

const fixtures = "../testdata/nvidia-smi/"

var quiet = slog.New(slog.DiscardHandler)

// noDRM is a host without DRM cards.
var noDRM = drm.Probe{Sys: "/nonexistent", Proc: "/nonexistent"}

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
	{Index: 0, Vendor: gpuvendor.NVIDIA, UUID: uuid0, Name: "NVIDIA H100 80GB HBM3", Visible: "0", Node: "0", Total: 81559 * mib, Used: 62071 * mib, Free: 18934 * mib, HaveMemory: true},
	{Index: 1, Vendor: gpuvendor.NVIDIA, UUID: uuid1, Name: "NVIDIA H100 80GB HBM3", Visible: "1", Node: "1", Total: 81559 * mib, Used: 1 * mib, Free: 81004 * mib, HaveMemory: true},
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
	want := Device{Index: 3, Vendor: gpuvendor.NVIDIA, UUID: "GPU-x", Name: "Odd, Board", Visible: "3", Node: "3", Total: 100 * mib, Used: 40 * mib, Free: 60 * mib, HaveMemory: true}
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
	probe, closeFn := open(context.Background(), failingNVML{}, noDRM, quiet)
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
	probe, closeFn := open(context.Background(), failingNVML{}, noDRM, quiet)
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
	probe, _ := open(context.Background(), failingNVML{}, noDRM, quiet)
	if c, ok := probe.(Combined); !ok || c.NVIDIA != (None{}) {
		t.Errorf("probe = %#v, want None for NVIDIA", probe)
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
	mig               []NVMLDevice // nil: not in MIG mode
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
func (d *fakeDevice) MIG() ([]NVMLDevice, error)               { return d.mig, nil }

func TestNVMLProbe_Snapshot(t *testing.T) {
	lib := &fakeNVML{devices: []fakeDevice{
		{uuid: uuid0, name: "NVIDIA H200", total: 140 << 30, used: 100 << 30, free: 40 << 30,
			procs: []NVMLProcess{{PID: 10, Used: 60 << 30}, {PID: 11, Used: NVMLValueNotAvailable}}},
		{uuid: uuid1, name: "NVIDIA H200", total: 140 << 30, free: 140 << 30},
	}}
	probe, closeFn := open(context.Background(), lib, noDRM, quiet)
	snap, err := probe.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := Snapshot{
		Source: SourceNVML,
		Devices: []Device{
			{Index: 0, Vendor: gpuvendor.NVIDIA, UUID: uuid0, Name: "NVIDIA H200", Visible: "0", Node: "0", Total: 140 << 30, Used: 100 << 30, Free: 40 << 30, HaveMemory: true},
			{Index: 1, Vendor: gpuvendor.NVIDIA, UUID: uuid1, Name: "NVIDIA H200", Visible: "1", Node: "1", Total: 140 << 30, Free: 140 << 30, HaveMemory: true},
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

// recordedNVML loads NVML's answers from probes/testdata/nvml (README
// there) as a fakeNVML.
func recordedNVML(t *testing.T, name string) *fakeNVML {
	t.Helper()
	type rec struct {
		UUID, Name        string
		Total, Used, Free uint64
		Processes         []struct{ PID, Used uint64 }
		MIG               []*rec
	}
	var box struct{ Devices []rec }
	b, err := os.ReadFile("../testdata/nvml/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &box); err != nil {
		t.Fatal(err)
	}
	var dev func(r rec) fakeDevice
	dev = func(r rec) fakeDevice {
		d := fakeDevice{uuid: r.UUID, name: r.Name, total: r.Total, used: r.Used, free: r.Free}
		for _, p := range r.Processes {
			d.procs = append(d.procs, NVMLProcess{PID: uint32(p.PID), Used: p.Used})
		}
		if r.MIG != nil {
			d.mig = make([]NVMLDevice, len(r.MIG))
			for i, m := range r.MIG {
				if m != nil {
					md := dev(*m)
					d.mig[i] = &md
				}
			}
		}
		return d
	}
	lib := &fakeNVML{}
	for _, r := range box.Devices {
		lib.devices = append(lib.devices, dev(r))
	}
	return lib
}

func TestNVMLProbe_MIGInstancesAreDevices(t *testing.T) {
	probe, closeFn := open(context.Background(), recordedNVML(t, "h100-mig.json"), noDRM, quiet)
	defer closeFn()
	snap, err := probe.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const mig0, mig2 = "MIG-8f4c2a1b-3d5e-5f60-8a7b-9c0d1e2f3a4b", "MIG-0b1c2d3e-4f50-5a6b-8c7d-8e9f0a1b2c3d"
	want := []Device{
		{Index: 0, Vendor: gpuvendor.NVIDIA, UUID: mig0, Name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb", Visible: mig0, Node: "0:0",
			Total: 42144366592, Used: 36507222016, Free: 5637144576, HaveMemory: true},
		{Index: 1, Vendor: gpuvendor.NVIDIA, UUID: mig2, Name: "NVIDIA H100 80GB HBM3 MIG 2g.20gb", Visible: mig2, Node: "0:2",
			Total: 20937965568, Used: 9865003008, Free: 11072962560, HaveMemory: true},
		{Index: 2, Vendor: gpuvendor.NVIDIA, UUID: uuid1, Name: "NVIDIA H100 80GB HBM3", Visible: "1", Node: "1",
			Total: 85520809984, Used: 64911884288, Free: 20608925696, HaveMemory: true},
	}
	if !reflect.DeepEqual(snap.Devices, want) {
		t.Errorf("devices (GPU 0 gives way to its instances):\n got %+v\nwant %+v", snap.Devices, want)
	}
	if !snap.Devices[1].MIG() || snap.Devices[2].MIG() {
		t.Error("MIG() does not tell the instance from the GPU")
	}
	// Per-process memory within each instance, attributed to its models.
	usage := ModelUsage(map[string][]int{"big": {7100}, "small": {7200, 7201}, "whole": {7300}}, snap.Processes)
	wantUsage := map[string]map[int]int64{"big": {0: 36305895424}, "small": {1: 9663676416}, "whole": {2: 64424509440}}
	if !reflect.DeepEqual(usage, wantUsage) {
		t.Errorf("usage = %v, want %v", usage, wantUsage)
	}
}

// mixedDRM is the recorded NVIDIA+AMD box's DRM side.
var mixedDRM = drm.Probe{Sys: "../testdata/drm/mixed/sys", Proc: "../testdata/drm/mixed/proc"}

func TestCombined_MixedBoxNVIDIAFirst(t *testing.T) {
	lib := &fakeNVML{devices: []fakeDevice{{uuid: uuid0, name: "NVIDIA H100 80GB HBM3", total: 80 << 30, used: 10 << 30, free: 70 << 30,
		procs: []NVMLProcess{{PID: 6000, Used: 9 << 30}}}}}
	probe, closeFn := open(context.Background(), lib, mixedDRM, quiet)
	defer closeFn()
	snap, err := probe.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Source != "nvml+drm" {
		t.Errorf("source = %q", snap.Source)
	}
	want := []Device{
		{Index: 0, Vendor: gpuvendor.NVIDIA, UUID: uuid0, Name: "NVIDIA H100 80GB HBM3", Visible: "0", Node: "0",
			Total: 80 << 30, Used: 10 << 30, Free: 70 << 30, HaveMemory: true},
		{Index: 1, Vendor: gpuvendor.AMD, Name: "AMD Instinct MI210", PCI: "0000:41:00.0", Visible: "0", Node: "/dev/dri/renderD128",
			Total: 68702699520, Used: 17263755264, Free: 68702699520 - 17263755264, HaveMemory: true},
	}
	if !reflect.DeepEqual(snap.Devices, want) {
		t.Errorf("devices:\n got %+v\nwant %+v", snap.Devices, want)
	}
	usage := ModelUsage(map[string][]int{"cuda": {6000}, "rocm": {6100}}, snap.Processes)
	if want := (map[string]map[int]int64{"cuda": {0: 9 << 30}, "rocm": {1: 16 << 30}}); !reflect.DeepEqual(usage, want) {
		t.Errorf("usage = %v, want %v", usage, want)
	}
}

func TestCombined_DRMOnly(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	probe, _ := open(context.Background(), failingNVML{}, drm.Probe{Sys: "../testdata/drm/mi300x/sys", Proc: "../testdata/drm/mi300x/proc"}, quiet)
	snap, err := probe.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Source != SourceDRM || len(snap.Devices) != 2 || snap.Devices[1].Visible != "1" || snap.Devices[1].Node != "/dev/dri/renderD129" {
		t.Errorf("got %+v", snap)
	}
}

// failingDRM is a sysfs that cannot be read.
type failingDRM struct{}

func (failingDRM) Read(context.Context) (drm.Reading, error) {
	return drm.Reading{}, errors.New("permission denied")
}

func TestCombined_DRMFailureFailsSnapshot(t *testing.T) {
	// The DRM cards' indexes follow NVIDIA's count: half a reading would
	// move them.
	_, err := Combined{NVIDIA: None{}, DRM: failingDRM{}}.Snapshot(context.Background())
	if err == nil || !strings.Contains(err.Error(), "drm: permission denied") {
		t.Errorf("err = %v", err)
	}
}

func TestCombined_IntelArc(t *testing.T) {
	snap, err := Combined{NVIDIA: None{}, DRM: drm.Probe{Sys: "../testdata/drm/intel-arc/sys", Proc: "../testdata/drm/intel-arc/proc"}}.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{{Index: 0, Vendor: gpuvendor.Intel, Name: "Intel 8086:e20b", PCI: "0000:03:00.0", Visible: "0", Node: "/dev/dri/renderD129",
		Total: 12 << 30, Used: 6 << 30, Free: 6 << 30, HaveMemory: true}}
	if !reflect.DeepEqual(snap.Devices, want) {
		t.Errorf("devices:\n got %+v\nwant %+v", snap.Devices, want)
	}
	if len(snap.Processes) != 1 || snap.Processes[0] != (Process{PID: 3300, GPUIndex: 0, Used: 6 << 30, HaveUsed: true}) {
		t.Errorf("processes = %+v", snap.Processes)
	}
}
