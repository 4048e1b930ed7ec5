//go:build linux

package systemd_test

import "os/exec"

func execOut(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}
