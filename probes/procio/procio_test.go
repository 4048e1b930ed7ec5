package procio

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseRchar(t *testing.T) {
	recorded, err := os.ReadFile("testdata/io-vllm.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, in string
		want     uint64
		err      string
	}{
		{"recorded", string(recorded), 16812304711, ""},
		{"rchar not first", "wchar: 1\nrchar: 42\n", 42, ""},
		{"no trailing newline", "rchar: 7", 7, ""},
		{"empty", "", 0, "no rchar line"},
		{"not a number", "rchar: lots\n", 0, "rchar: "},
		{"negative", "rchar: -1\n", 0, "rchar: "},
		{"prefix is not the key", "rchars: 5\n", 0, "no rchar line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRchar([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// A child that reads a real file shows at least its size in rchar; the
// read is held at its end by a pipe the test writes to, so the reading is
// taken while the child lives.
func TestReader_ChildReadingAFile(t *testing.T) {
	const size = 3 << 20
	path := filepath.Join(t.TempDir(), "weights.gguf")
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	// cat reads the file, then blocks reading its stdin until the test
	// closes it.
	cmd := exec.Command("cat", path, "-")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	// The file is read once its bytes came out of the pipe.
	if n, err := io.CopyN(io.Discard, out, size); err != nil || n != size {
		t.Fatalf("copied %d: %v", n, err)
	}
	got, err := Reader{}.Read([]int{cmd.Process.Pid, 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[cmd.Process.Pid] < size {
		t.Fatalf("Read = %v, want rchar of pid %d at least %d (the gone pid left out)", got, cmd.Process.Pid, size)
	}
}

func TestReader_RecordedTree(t *testing.T) {
	root := t.TempDir()
	for pid, text := range map[int]string{10: "rchar: 100\n", 11: "rchar: 5\nwchar: 0\n", 12: "garbage\n"} {
		dir := filepath.Join(root, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "io"), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Reader{Root: root}.Read([]int{10, 11, 12, 13})
	if err != nil || len(got) != 2 || got[10] != 100 || got[11] != 5 {
		t.Fatalf("Read = %v, %v; want 10:100 11:5", got, err)
	}
	if _, err := (Reader{Root: root}).Read([]int{12, 13}); err == nil || !strings.Contains(err.Error(), "pid 12") {
		t.Fatalf("none readable: err = %v, want the first failure (pid 12)", err)
	}
}

func FuzzParseRchar(f *testing.F) {
	if b, err := os.ReadFile("testdata/io-vllm.txt"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("rchar: 1\n"))
	f.Add([]byte("rchar:\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := ParseRchar(data)
		if err != nil && n != 0 {
			t.Fatalf("error with a value: %d, %v", n, err)
		}
	})
}
