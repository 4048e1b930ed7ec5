package drm

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/napd/napd/gpuvendor"
)

const (
	kib = 1 << 10
	gib = 1 << 30
)

// box is a recorded tree under probes/testdata/drm: its sys and proc.
func box(name string) Probe {
	root := filepath.Join("..", "testdata", "drm", name)
	return Probe{Sys: filepath.Join(root, "sys"), Proc: filepath.Join(root, "proc")}
}

func read(t *testing.T, name string) Reading {
	t.Helper()
	r, err := box(name).Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRead_MI300X(t *testing.T) {
	r := read(t, "mi300x")
	want := []Card{
		{Name: "card1", PCI: "0000:11:00.0", Vendor: gpuvendor.AMD, Driver: "amdgpu", Model: "AMD Instinct MI300X",
			Render: "renderD128", ROCmIndex: 0, Total: 206141652992, Used: 186051289088, HaveUsed: true},
		{Name: "card2", PCI: "0000:2f:00.0", Vendor: gpuvendor.AMD, Driver: "amdgpu", Model: "AMD Instinct MI300X",
			Render: "renderD129", ROCmIndex: 1, Total: 206141652992, Used: 44023414784, HaveUsed: true},
	}
	if !reflect.DeepEqual(r.Cards, want) {
		t.Errorf("cards (the BMC's ast display left out):\n got %+v\nwant %+v", r.Cards, want)
	}
	// vLLM's client counts once though it holds it through two fds and
	// its worker inherited a third; the tool with no VRAM holds 0. KFD's
	// count of the same memory adds nothing; a ROCm process seen by KFD
	// only (4300, no DRM fd napd can read) is counted from it.
	wantClients := []Client{
		{PID: 900, PCI: "0000:11:00.0", Used: 0},
		{PID: 4100, PCI: "0000:11:00.0", Used: 176160768 * kib},
		{PID: 4200, PCI: "0000:2f:00.0", Used: 41943040 * kib},
		{PID: 4300, PCI: "0000:11:00.0", Used: 2 * gib},
	}
	if !reflect.DeepEqual(r.Clients, wantClients) {
		t.Errorf("clients:\n got %+v\nwant %+v", r.Clients, wantClients)
	}
}

func TestRead_RadeonDesktopOlderKeys(t *testing.T) {
	r := read(t, "radeon")
	if len(r.Cards) != 1 || r.Cards[0].Model != "AMD 1002:744c" || r.Cards[0].Render != "renderD128" ||
		r.Cards[0].Total != 25753026560 || r.Cards[0].Used != 12314279936 || r.Cards[0].UsedFromClients {
		t.Errorf("cards = %+v, want the RX 7900 XTX with sysfs's used figure (the DP connector left out)", r.Cards)
	}
	// drm-memory-vram, kernel 6.1's spelling; the compositor's two
	// clients (card node and render node) add up.
	want := []Client{
		{PID: 1500, PCI: "0000:03:00.0", Used: (262144 + 45056) * kib},
		{PID: 2300, PCI: "0000:03:00.0", Used: 11010048 * kib},
	}
	if !reflect.DeepEqual(r.Clients, want) {
		t.Errorf("clients:\n got %+v\nwant %+v", r.Clients, want)
	}
}

func TestRead_IntelArcUsedFromClients(t *testing.T) {
	r := read(t, "intel-arc")
	want := []Card{{Name: "card1", PCI: "0000:03:00.0", Vendor: gpuvendor.Intel, Driver: "xe", Model: "Intel 8086:e20b",
		Render: "renderD129", ROCmIndex: -1, Total: 12 * gib, Used: 6291456 * kib, HaveUsed: true, UsedFromClients: true}}
	if !reflect.DeepEqual(r.Cards, want) {
		t.Errorf("cards (the integrated i915 GPU left out):\n got %+v\nwant %+v", r.Cards, want)
	}
	if len(r.Clients) != 1 || r.Clients[0] != (Client{PID: 3300, PCI: "0000:03:00.0", Used: 6291456 * kib}) {
		t.Errorf("clients = %+v, want llama-server's 6 GiB of vram0 only", r.Clients)
	}
}

func TestRead_MixedLeavesNVIDIAToNVML(t *testing.T) {
	r := read(t, "mixed")
	if len(r.Cards) != 1 || r.Cards[0].PCI != "0000:41:00.0" || r.Cards[0].Model != "AMD Instinct MI210" {
		t.Errorf("cards = %+v, want the MI210 only", r.Cards)
	}
	if len(r.Clients) != 1 || r.Clients[0].PID != 6100 {
		t.Errorf("clients = %+v, want pid 6100's", r.Clients)
	}
}

func TestRead_NoDRM(t *testing.T) {
	dir := t.TempDir()
	r, err := Probe{Sys: dir, Proc: dir}.Read(context.Background())
	if err != nil || len(r.Cards) != 0 {
		t.Errorf("got %+v, %v; want nothing", r, err)
	}
}

func TestRead_CorruptSysfsNamesFile(t *testing.T) {
	sys := t.TempDir()
	dev := filepath.Join(sys, "class", "drm", "card0", "device")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dev, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("uevent", "DRIVER=amdgpu\nPCI_ID=1002:744C\nPCI_SLOT_NAME=0000:03:00.0\n")
	write("mem_info_vram_total", "lots\n")
	_, err := Probe{Sys: sys, Proc: t.TempDir()}.Read(context.Background())
	if err == nil || !strings.Contains(err.Error(), "mem_info_vram_total") {
		t.Errorf("err = %v, want one naming mem_info_vram_total", err)
	}
}

func TestRead_Cancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := box("mi300x").Read(ctx); err == nil {
		t.Error("a cancelled read succeeded")
	}
}

func TestParseFdinfo(t *testing.T) {
	f, ok, err := ParseFdinfo([]byte("pos:\t0\ndrm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t9\n" +
		"drm-memory-vram:\t2 MiB\ndrm-resident-vram:\t3 MiB\ndrm-total-local0:\t5\ndrm-memory-gtt:\t7 KiB\n" +
		"drm-engine-gfx:\t12 ns\ndrm-maxfreq-gfx:\t2000 MHz\namd-evicted-vram:\t0 KiB\n"))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if f.Driver != "amdgpu" || f.PDev != "0000:03:00.0" || !f.HaveClientID || f.ClientID != 9 {
		t.Errorf("got %+v", f)
	}
	if f.Resident["vram"] != 3<<20 || f.Resident["gtt"] != 7<<10 || f.Total["local0"] != 5 {
		t.Errorf("regions: resident %v total %v (drm-resident- wins over drm-memory-)", f.Resident, f.Total)
	}
	if b, ok := f.DeviceMemory(); !ok || b != 3<<20+5 {
		t.Errorf("device memory = %d, %v; want vram's resident and local0's total", b, ok)
	}
	if _, ok, _ := ParseFdinfo([]byte("pos:\t0\nflags:\t02\n")); ok {
		t.Error("a file without drm-driver is a DRM client")
	}
}

func TestParseFdinfo_Malformed(t *testing.T) {
	for _, text := range []string{
		"drm-driver: x\ndrm-client-id: -1\n",
		"drm-driver: x\ndrm-memory-vram: 12 GB\n",
		"drm-driver: x\ndrm-total-vram: many\n",
		"drm-driver: x\ndrm-resident-vram: 9223372036854775807 KiB\n",
	} {
		if f, _, err := ParseFdinfo([]byte(text)); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("ParseFdinfo(%q) = %+v, %v; want an error naming line 2", text, f, err)
		}
	}
}

func FuzzParseFdinfo(f *testing.F) {
	for _, p := range []string{"mi300x/proc/4100/fdinfo/18", "radeon/proc/1500/fdinfo/12", "intel-arc/proc/3300/fdinfo/7", "intel-arc/proc/1200/fdinfo/6"} {
		b, err := os.ReadFile(filepath.Join("..", "testdata", "drm", p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fi, ok, err := ParseFdinfo(b)
		if err != nil {
			return
		}
		if ok && fi.Driver == "" {
			t.Fatal("a client without a driver")
		}
		for _, m := range []map[string]int64{fi.Resident, fi.Total} {
			for r, v := range m {
				if v < 0 || r == "" {
					t.Fatalf("region %q = %d", r, v)
				}
			}
		}
		if v, _ := fi.DeviceMemory(); v < 0 {
			t.Fatalf("device memory %d", v)
		}
	})
}

// BenchmarkClients_ThisHost reads every process's fds on this host as a
// round on a GPU box does (the cards' list does not change what is read).
func BenchmarkClients_ThisHost(b *testing.B) {
	p := Probe{Sys: "/sys", Proc: "/proc"}
	cards := []Card{{PCI: "0000:11:00.0"}}
	for b.Loop() {
		if _, err := p.clients(context.Background(), cards); err != nil {
			b.Fatal(err)
		}
	}
}
