package harness

import (
	"os"
	"path/filepath"
	"testing"
)

// Main runs a test binary's tests, then removes the programs Bin and
// ExampleWorker built for it (tens of MB a package, left in the temp dir
// by every run otherwise). Every package that uses Bin, Start, Prepare or
// ExampleWorker calls it from its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if workerPath != "" {
		os.RemoveAll(filepath.Dir(workerPath))
	}
	return code
}
