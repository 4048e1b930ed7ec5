package chaos

import (
	"os"
	"testing"

	"github.com/napd/napd/tests/harness"
)

// TestMain removes the programs the harness built once the tests are done.
func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
