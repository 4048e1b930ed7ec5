package process

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// An engine's pipe is grown to 1 MiB where the kernel allows it, so that
// lines gathering while the copier waits do not hold the engine up.
func TestGrowPipe(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	growPipe(pw)
	rc, err := pw.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	size := 0
	if err := rc.Control(func(fd uintptr) { size, err = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) }); err != nil || size == 0 {
		t.Fatalf("F_GETPIPE_SZ: %d, %v", size, err)
	}
	if size < 1<<20 {
		t.Errorf("pipe holds %d bytes, want 1 MiB", size)
	}
}

// Whatever the batching, everything written reaches the log, in order,
// up to the pipe's end.
func TestCopyOutput_CopiesAllInOrder(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for i := range 2000 {
		lines = append(lines, strings.Repeat("x", i%97)+"\n")
	}
	want := strings.Join(lines, "")
	go func() {
		for _, line := range lines {
			_, _ = pw.WriteString(line)
		}
		pw.Close()
	}()
	var got bytes.Buffer
	copyOutput(&got, pr, nil)
	pr.Close()
	if got.String() != want {
		t.Errorf("copied %d bytes, want %d, in order", got.Len(), len(want))
	}
}
