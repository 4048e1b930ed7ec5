// Package evidence_test drives napd end to end on what it proves about
// engines it did not write: idleness from the socket table for engines
// without metrics, who listens on an engine's port, and the health of
// awake engines. Real napd, real napd-demo-engine processes in their
// llama.cpp, TGI, Ollama and generic flavors, real sockets.
package evidence_test

import (
	"os"
	"testing"

	"github.com/napd/napd/tests/harness"
)

// TestMain removes the programs the harness built once the tests are done.
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
