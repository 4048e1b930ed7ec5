package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// portVar is replaced by the model's port in command and environment.
const portVar = "${PORT}"

// ExpandPort returns the model's command and environment with every ${PORT}
// replaced by port. The model itself is left unchanged (a model with port = 0
// gets a new port at each start).
func (m *Model) ExpandPort(port int) (command []string, env map[string]string) {
	p := strconv.Itoa(port)
	if m.Command != nil {
		command = make([]string, len(m.Command))
		for i, s := range m.Command {
			command[i] = strings.ReplaceAll(s, portVar, p)
		}
	}
	if m.Environment != nil {
		env = make(map[string]string, len(m.Environment))
		for k, v := range m.Environment {
			env[k] = strings.ReplaceAll(v, portVar, p)
		}
	}
	return command, env
}

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
