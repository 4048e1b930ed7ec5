package container

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/napd/napd/internal/statefile"
)

// stateFile, under state_dir, keeps this napd's instance ID (the value of
// the napd.instance label on every container it creates: two napds on one
// host, or a test's beside an operator's, never touch each other's) and
// the runtimes it has created containers with, which it sweeps at start
// even when the config no longer names them.
const stateFile = "containers.json"

// maxStateFile bounds the file; it holds a few dozen bytes.
const maxStateFile = 64 << 10

type state struct {
	Instance string            `json:"instance"`
	Runtimes map[string]string `json:"runtimes"` // runtime -> its executable
}

// loadState reads the state file, or makes a new instance ID when there is
// none; it is written with the first runtime napd creates a container
// with (a napd without containers leaves no file).
func loadState(path string) (state, error) {
	var st state
	data, err := statefile.Read(path, maxStateFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		id := make([]byte, 8)
		_, _ = rand.Read(id)
		st.Instance = hex.EncodeToString(id)
	case err != nil:
		return st, err
	default:
		if err := json.Unmarshal(data, &st); err != nil {
			return st, fmt.Errorf("%s: %w", path, err)
		}
		if st.Instance == "" {
			return st, fmt.Errorf("%s: no instance", path)
		}
	}
	if st.Runtimes == nil {
		st.Runtimes = map[string]string{}
	}
	return st, nil
}

func saveState(path string, st state) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return statefile.Write(path, append(data, '\n'), 0o600)
}
