package config

import (
	"fmt"
	"net"
)

// FreePort asks the kernel for a free TCP port on loopback, for a model with
// port = 0. The port is free when FreePort returns; the engine must bind it
// soon after.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
