//go:build linux

package host

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/shirou/gopsutil/v4/mem"
)

const fixtures = "../testdata/psi/"

func TestParsePSI_RecordedFiles(t *testing.T) {
	tests := []struct {
		file string
		want PSI
	}{
		{"idle.txt", PSI{}},
		{"pressure.txt", PSI{
			Some: PSILine{Avg10: 23.51, Avg60: 11.07, Avg300: 3.42, Total: 98123456},
			Full: PSILine{Avg10: 9.80, Avg60: 4.12, Avg300: 1.05, Total: 40211873},
		}},
		{"some-only.txt", PSI{}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			text, err := os.ReadFile(fixtures + tt.file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParsePSI(text)
			if err != nil {
				t.Fatalf("ParsePSI: %v", err)
			}
			if got != tt.want {
				t.Errorf("ParsePSI = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParsePSI_Malformed(t *testing.T) {
	for _, text := range []string{
		"",
		"full avg10=1.00 avg60=0.00 avg300=0.00 total=0\n",
		"some avg10=abc avg60=0.00 avg300=0.00 total=0\n",
		"some avg10=101.00 avg60=0.00 avg300=0.00 total=0\n",
		"some avg10=NaN avg60=0.00 avg300=0.00 total=0\n",
		"some avg10\n",
		"some avg10=1.00 total=-1\n",
		"partial avg10=1.00\n",
	} {
		if got, err := ParsePSI([]byte(text)); err == nil {
			t.Errorf("ParsePSI(%q) = %+v, want an error", text, got)
		}
	}
}

func TestParsePSI_IgnoresUnknownKeys(t *testing.T) {
	got, err := ParsePSI([]byte("some avg10=1.50 avg60=0.00 avg300=0.00 total=7 avg900=2.00\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Some.Avg10 != 1.5 || got.Some.Total != 7 {
		t.Errorf("got %+v", got)
	}
}

func FuzzParsePSI(f *testing.F) {
	for _, name := range []string{"idle.txt", "pressure.txt", "some-only.txt"} {
		text, err := os.ReadFile(fixtures + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(text)
	}
	f.Add([]byte("some avg10=1e2 total=18446744073709551615"))
	f.Fuzz(func(t *testing.T, text []byte) {
		psi, err := ParsePSI(text)
		if err != nil {
			return
		}
		for _, l := range []PSILine{psi.Some, psi.Full} {
			for _, v := range []float64{l.Avg10, l.Avg60, l.Avg300} {
				if !(v >= 0 && v <= 100) {
					t.Fatalf("accepted average %v out of range", v)
				}
			}
		}
	})
}

func fakeVM(total, avail uint64) func(context.Context) (*mem.VirtualMemoryStat, error) {
	return func(context.Context) (*mem.VirtualMemoryStat, error) {
		return &mem.VirtualMemoryStat{Total: total, Available: avail}, nil
	}
}

func TestReader_Snapshot(t *testing.T) {
	r := &Reader{PSIPath: fixtures + "pressure.txt", VirtualMemory: fakeVM(64<<30, 3<<30)}
	got, err := r.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got.MemTotal != 64<<30 || got.MemAvailable != 3<<30 {
		t.Errorf("memory = %d/%d", got.MemAvailable, got.MemTotal)
	}
	if !got.HavePSI || got.PSI.Some.Avg10 != 23.51 {
		t.Errorf("PSI = %+v (have %v)", got.PSI, got.HavePSI)
	}
}

func TestReader_SnapshotWithoutPSIFile(t *testing.T) {
	r := &Reader{PSIPath: filepath.Join(t.TempDir(), "absent"), VirtualMemory: fakeVM(1, 1)}
	got, err := r.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("missing PSI file must not be an error: %v", err)
	}
	if got.HavePSI {
		t.Error("HavePSI = true for a missing file")
	}
}

func TestReader_SnapshotErrors(t *testing.T) {
	boom := errors.New("boom")
	r := &Reader{VirtualMemory: func(context.Context) (*mem.VirtualMemoryStat, error) { return nil, boom }}
	if _, err := r.Snapshot(context.Background()); !errors.Is(err, boom) {
		t.Errorf("err = %v, want it to wrap %v", err, boom)
	}
	bad := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(bad, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = &Reader{PSIPath: bad, VirtualMemory: fakeVM(1, 1)}
	if _, err := r.Snapshot(context.Background()); err == nil {
		t.Error("malformed PSI file: want an error")
	}
}

func TestReader_SnapshotLiveHost(t *testing.T) {
	got, err := (&Reader{}).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got.MemTotal <= 0 || got.MemAvailable <= 0 || got.MemAvailable > got.MemTotal {
		t.Errorf("implausible host memory: %d available of %d", got.MemAvailable, got.MemTotal)
	}
}
