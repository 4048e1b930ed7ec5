// Package remote runs napd's remote models end to end: a second napd on
// loopback as the remote, and a demo engine behind TLS with a CA made in
// the test.
package remote

import (
	"os"
	"testing"

	"github.com/napd/napd/tests/harness"
)

// TestMain removes the programs the harness built once the tests are done.
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
