package llamaswap

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// container is a `docker run` or `podman run` line taken apart into napd's
// container keys.
type container struct {
	runtime       string // "docker" | "podman"
	name          string // --name, for cmdStop
	image         string
	command       []string // after the image: the container's command
	args          []string // other options of run, as written
	volumes       []string
	env           [][2]string
	hostPort      int // from --publish: 0 for ${PORT} (or none), else fixed
	containerPort int // from --publish; 0 when none
	pull          string
}

// runValueFlags are the options of docker run and podman run that take a
// value as the next word (the others handled below are separate): the
// image is the first word that is neither an option nor such a value.
var runValueFlags = []string{
	"-a", "--attach", "--add-host", "--annotation", "--blkio-weight", "--cap-add", "--cap-drop", "--cgroup-parent",
	"--cgroupns", "--cidfile", "--cpu-period", "--cpu-quota", "--cpu-shares", "-c", "--cpus", "--cpuset-cpus",
	"--cpuset-mems", "--device", "--device-cgroup-rule", "--dns", "--dns-option", "--dns-search", "--entrypoint",
	"--env-file", "--expose", "--gpus", "--group-add", "--health-cmd", "--health-interval", "--health-retries",
	"--health-start-period", "--health-timeout", "-h", "--hostname", "--ip", "--ip6", "--ipc", "--isolation",
	"-l", "--label", "--label-file", "--link", "--log-driver", "--log-opt", "--mac-address", "-m", "--memory",
	"--memory-reservation", "--memory-swap", "--mount", "--network", "--net", "--network-alias", "--pid",
	"--pids-limit", "--platform", "--restart", "--runtime", "--security-opt", "--shm-size", "--stop-signal",
	"--stop-timeout", "--storage-opt", "--sysctl", "--tmpfs", "--ulimit", "-u", "--user", "--userns", "--uts",
	"-w", "--workdir", "--device-read-bps", "--device-write-bps", "--hooks-dir", "--arch", "--os", "--variant",
}

// parseRun takes apart argv when it is a docker or podman run line; nil
// when it is not one.
func parseRun(argv []string) *container {
	if len(argv) < 3 || argv[1] != "run" {
		return nil
	}
	c := &container{runtime: filepath.Base(argv[0])}
	if c.runtime != "docker" && c.runtime != "podman" {
		return nil
	}
	rest := argv[2:]
	for len(rest) > 0 {
		a := rest[0]
		rest = rest[1:]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			c.image = a
			c.command = rest
			return c
		}
		flag, val, hasVal := strings.Cut(a, "=")
		next := func() string {
			if hasVal {
				return val
			}
			if len(rest) == 0 {
				return ""
			}
			v := rest[0]
			rest = rest[1:]
			return v
		}
		switch {
		case flag == "--rm" || flag == "--detach" || flag == "--interactive" || flag == "--tty" ||
			(len(flag) > 1 && flag[1] != '-' && strings.Trim(flag[1:], "dit") == ""):
			// napd runs the container in the foreground and removes it.
		case flag == "--name":
			c.name = next()
		case flag == "-v" || flag == "--volume":
			c.volumes = append(c.volumes, next())
		case flag == "-e" || flag == "--env":
			kv := next()
			if k, v, ok := strings.Cut(kv, "="); ok {
				c.env = append(c.env, [2]string{k, v})
			} else {
				c.args = append(c.args, "--env", kv) // the host's value
			}
		case (flag == "-p" || flag == "--publish") && c.containerPort == 0:
			spec := next()
			if host, ctr, ok := publish(spec); ok {
				c.hostPort, c.containerPort = host, ctr
			} else {
				c.args = append(c.args, "--publish", spec)
			}
		case flag == "--pull":
			c.pull = next()
		case (slices.Contains(runValueFlags, flag) || flag == "-p" || flag == "--publish") && !hasVal:
			c.args = append(c.args, flag, next())
		default:
			c.args = append(c.args, a)
		}
	}
	return nil // no image
}

// publish reads a --publish spec, [IP:]HOSTPORT:CONTAINERPORT[/tcp], whose
// host port is ${PORT} (0) or a number.
func publish(spec string) (host, ctr int, ok bool) {
	spec = strings.TrimSuffix(spec, "/tcp")
	i := strings.LastIndexByte(spec, ':')
	if i < 0 {
		return 0, 0, false
	}
	hostPart, ctrPart := spec[:i], spec[i+1:]
	if j := strings.LastIndexByte(hostPart, ':'); j >= 0 {
		switch ip := hostPart[:j]; ip {
		case "", "127.0.0.1", "localhost", "0.0.0.0", "[::1]", "::1":
		default:
			return 0, 0, false
		}
		hostPart = hostPart[j+1:]
	}
	ctr, err := strconv.Atoi(ctrPart)
	if err != nil || ctr < 1 || ctr > 65535 {
		return 0, 0, false
	}
	if hostPart == "${PORT}" {
		return 0, ctr, true
	}
	host, err = strconv.Atoi(hostPart)
	if err != nil || host < 1 || host > 65535 {
		return 0, 0, false
	}
	return host, ctr, true
}

// stops reports whether argv (a cmdStop) stops this container: docker or
// podman stop, kill or rm -f, naming it.
func (c *container) stops(argv []string) bool {
	if len(argv) < 3 || filepath.Base(argv[0]) != c.runtime {
		return false
	}
	switch argv[1] {
	case "stop", "kill", "rm":
	default:
		return false
	}
	return c.name == "" || slices.Contains(argv[2:], c.name)
}
