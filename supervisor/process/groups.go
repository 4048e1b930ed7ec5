//go:build linux

package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/napd/napd/internal/statefile"
)

// groupsFile, under state_dir, names the process group of every engine
// napd started and has not yet seen gone. A napd that is SIGKILLed takes
// its engines' leaders with it (Pdeathsig), but not what they spawned: the
// next napd reads the file at start and kills those remains before it
// starts anything on their ports.
//
// Remains are killed, never adopted: with the leader gone there is no
// process napd could wait on or read the output of, and no engine it
// could verify as a whole.
const groupsFile = "engines.json"

// maxGroupsFile bounds the file; a record is under a hundred bytes.
const maxGroupsFile = 1 << 20

// groupRecord identifies one engine process group across a napd restart.
// A PID can be reused, so a process counts as the group's only if it is in
// the group, started no earlier than its leader, in the same boot, and runs
// as the engine's user.
type groupRecord struct {
	PGID  int    `json:"pgid"`
	Start uint64 `json:"start_ticks"` // the leader's start, clock ticks after boot
	Boot  string `json:"boot_id"`
	UID   int    `json:"uid"`
}

// record identifies the group whose leader is pid, as it runs now.
func (p procFS) record(pid int) (groupRecord, error) {
	start, uid, err := p.identity(pid)
	if err != nil {
		return groupRecord{}, err
	}
	boot, err := p.bootID()
	if err != nil {
		return groupRecord{}, err
	}
	return groupRecord{PGID: pid, Start: start, Boot: boot, UID: uid}, nil
}

func (p procFS) bootID() (string, error) {
	b, err := os.ReadFile(filepath.Join(p.proc, "sys/kernel/random/boot_id"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// identity is pid's start time (clock ticks after boot) and effective uid
// (the owner of its /proc directory).
func (p procFS) identity(pid int) (start uint64, uid int, err error) {
	dir := filepath.Join(p.proc, strconv.Itoa(pid))
	fi, err := os.Stat(dir)
	if err != nil {
		return 0, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, errors.New("no owner")
	}
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0, 0, err
	}
	start, err = parseStartTime(b)
	return start, int(st.Uid), err
}

// parseStartTime reads field 22 (starttime) of a /proc/<pid>/stat line.
func parseStartTime(b []byte) (uint64, error) {
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	// Fields after the name start at field 3 (state); starttime is 22.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("stat: too few fields")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// remains lists the live processes that belong to the recorded group.
func (p procFS) remains(r groupRecord) []int {
	if boot, err := p.bootID(); err != nil || boot != r.Boot {
		return nil // another boot: the group died with it
	}
	var pids []int
	for _, pid := range p.groupPIDs(r.PGID) {
		start, uid, err := p.identity(pid)
		if err == nil && start >= r.Start && uid == r.UID {
			pids = append(pids, pid)
		}
	}
	return pids
}

// loadGroups reads the groups file; a missing one is empty.
func loadGroups(path string) (map[string]groupRecord, error) {
	groups := make(map[string]groupRecord)
	data, err := statefile.Read(path, maxGroupsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return groups, nil
	}
	if err != nil {
		return groups, err
	}
	if err := json.Unmarshal(data, &groups); err != nil {
		return make(map[string]groupRecord), fmt.Errorf("%s: %w", path, err)
	}
	return groups, nil
}

// saveGroups writes b.groups; b.mu is held. A failure is logged: the
// engine runs anyway, only a crash of napd would leave it unrecorded.
func (b *Backend) saveGroups() {
	data, err := json.MarshalIndent(b.groups, "", "  ")
	if err == nil {
		err = statefile.Write(b.groupsPath, append(data, '\n'), 0o600)
	}
	if err != nil {
		b.log.Warn("cannot record engine process groups", "err", err)
	}
}

// reapRemains kills, at start, what engines of a previous napd left behind.
func (b *Backend) reapRemains() {
	old, err := loadGroups(b.groupsPath)
	if err != nil {
		b.log.Error("engine process groups of a previous napd not read; nothing they name is killed", "err", err)
	}
	for model, r := range old {
		pids := b.fs.remains(r)
		if len(pids) == 0 {
			continue
		}
		b.log.Warn("killing what an engine of a previous napd left running", "model", model, "pgid", r.PGID, "pids", pids)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		b.awaitGone(func() []int { return b.fs.remains(r) }, "model", model, "pgid", r.PGID)
	}
	b.mu.Lock()
	b.saveGroups()
	b.mu.Unlock()
}
