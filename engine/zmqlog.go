package engine

import (
	"io"
	"log"
)

// discardLogger silences zmq4's own stderr logger: its messages are about
// individual connections, and Serve reports what matters through slog.
func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }
