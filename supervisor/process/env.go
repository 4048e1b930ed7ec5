package process

import (
	"fmt"
	"maps"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/napd/napd/supervisor"
)

// systemdVars belong to napd's own service (socket activation, sd_notify,
// watchdog). An engine that inherited them could notify or accept on napd's
// behalf, so they never reach it.
var systemdVars = []string{
	"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
	"NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC",
}

// environ is the engine's environment: napd's own (so PATH and HOME work as
// on the operator's shell), then the spec's variables, then the GPUs'
// visibility variables (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, …);
// sorted, without systemdVars.
func environ(base []string, spec supervisor.Spec) []string {
	vars := make(map[string]string, len(base)+len(spec.Environment)+1)
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	for k, v := range spec.Environment {
		vars[k] = v
	}
	maps.Copy(vars, spec.VisibleDevices())
	for _, k := range systemdVars {
		delete(vars, k)
	}
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return env
}

// credential resolves spec.User to the credential the engine runs with; nil
// when no user is set or napd already runs as that user.
func credential(name string) (*syscall.Credential, error) {
	if name == "" {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("user %q: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: gid %q: %w", name, u.Gid, err)
	}
	if int(uid) == os.Geteuid() {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("running the engine as user %q needs root; napd runs as uid %d", name, os.Geteuid())
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	gids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("user %q: groups: %w", name, err)
	}
	for _, g := range gids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			cred.Groups = append(cred.Groups, uint32(n))
		}
	}
	return cred, nil
}
