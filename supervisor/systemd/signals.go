//go:build linux

package systemd

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	godbus "github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"

	"github.com/napd/napd/supervisor"
)

const (
	ifaceUnit     = "org.freedesktop.systemd1.Unit"
	ifaceService  = "org.freedesktop.systemd1.Service"
	sigJobRemoved = "org.freedesktop.systemd1.Manager.JobRemoved"
	sigPropsChg   = "org.freedesktop.DBus.Properties.PropertiesChanged"
	unitPathNS    = "/org/freedesktop/systemd1/unit"
)

// ExecMainCode values (siginfo si_code of the main process's exit).
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// exitInfo is what systemd reports about a service's main process.
type exitInfo struct {
	Result string // Service.Result: success, exit-code, signal, core-dump, timeout, …
	Code   int32  // ExecMainCode: CLD_EXITED, CLD_KILLED, CLD_DUMPED
	Status int32  // ExecMainStatus: exit status or signal number
}

// String is the human reason: "exit-code (status=1)", "signal (SIGKILL)",
// "timeout", or "" when systemd reports success.
func (e exitInfo) String() string {
	switch {
	case e.Result == "" || e.Result == "success":
		return ""
	case e.Code == cldExited:
		return fmt.Sprintf("%s (status=%d)", e.Result, e.Status)
	case e.Code == cldKilled || e.Code == cldDumped:
		name := unix.SignalName(syscall.Signal(e.Status))
		if name == "" {
			name = "signal " + strconv.Itoa(int(e.Status))
		}
		return fmt.Sprintf("%s (%s)", e.Result, name)
	}
	return e.Result
}

// jobResult is a finished job's result ("done", "failed", …) and the
// unit's exit information at that moment.
type jobResult struct {
	Result string
	Exit   exitInfo
}

// tracker turns systemd's D-Bus signals into job results and Events. One
// goroutine feeds it signals; callers register job waiters and operator units.
type tracker struct {
	// jobMu is held by a caller from the start of a job call until its
	// waiter is registered, so a JobRemoved cannot slip by unclaimed.
	jobMu sync.Mutex
	jobs  map[uint32]chan jobResult

	mu     sync.Mutex
	exits  map[string]exitInfo // unit → last Service exit info seen
	active map[string]string   // unit → last ActiveState seen
	models map[string]string   // operator unit → model
}

func newTracker() *tracker {
	return &tracker{
		jobs:   map[uint32]chan jobResult{},
		exits:  map[string]exitInfo{},
		active: map[string]string{},
		models: map[string]string{},
	}
}

// watch makes events of an operator-owned unit carry its model's name.
func (tr *tracker) watch(spec supervisor.Spec) {
	if spec.Unit == "" {
		return
	}
	tr.mu.Lock()
	tr.models[spec.Unit] = spec.Model
	tr.mu.Unlock()
}

// modelOf maps a unit to the model it runs, "" when it is not napd's.
func (tr *tracker) modelOf(unit string) string {
	if m, ok := modelFromUnit(unit); ok {
		return m
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.models[unit]
}

// lastExit is the exit information last signalled for unit.
func (tr *tracker) lastExit(unit string) exitInfo {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.exits[unit]
}

// handle processes one signal; it returns an Event when a unit of a model
// changed its ActiveState.
func (tr *tracker) handle(sig *godbus.Signal, now time.Time) (supervisor.Event, bool) {
	switch sig.Name {
	case sigJobRemoved:
		var id uint32
		var job godbus.ObjectPath
		var unit, result string
		if godbus.Store(sig.Body, &id, &job, &unit, &result) != nil {
			return supervisor.Event{}, false
		}
		res := jobResult{Result: result, Exit: tr.lastExit(unit)}
		tr.jobMu.Lock()
		ch, ok := tr.jobs[id]
		delete(tr.jobs, id)
		tr.jobMu.Unlock()
		if ok {
			ch <- res // buffered, one send per waiter
		}
	case sigPropsChg:
		if !strings.HasPrefix(string(sig.Path), unitPathNS+"/") || len(sig.Body) < 2 {
			return supervisor.Event{}, false
		}
		iface, _ := sig.Body[0].(string)
		changed, _ := sig.Body[1].(map[string]godbus.Variant)
		unit := unescapeUnitPath(sig.Path)
		switch iface {
		case ifaceService:
			// systemd sends the Service change before the Unit change of the
			// same transition, so the reason is known when the state arrives.
			// Only napd's units are kept, so the maps stay bounded by models.
			if tr.modelOf(unit) == "" {
				return supervisor.Event{}, false
			}
			tr.mu.Lock()
			e := tr.exits[unit]
			if v, ok := changed["Result"].Value().(string); ok {
				e.Result = v
			}
			if v, ok := changed["ExecMainCode"].Value().(int32); ok {
				e.Code = v
			}
			if v, ok := changed["ExecMainStatus"].Value().(int32); ok {
				e.Status = v
			}
			tr.exits[unit] = e
			tr.mu.Unlock()
		case ifaceUnit:
			state, ok := changed["ActiveState"].Value().(string)
			if !ok {
				return supervisor.Event{}, false
			}
			model := tr.modelOf(unit)
			if model == "" {
				return supervisor.Event{}, false
			}
			tr.mu.Lock()
			prev := tr.active[unit]
			tr.active[unit] = state
			exit := tr.exits[unit]
			tr.mu.Unlock()
			ps, ok := eventState(state)
			// A unit first seen inactive is being created: no change to report.
			if !ok || state == prev || (prev == "" && state == "inactive") {
				return supervisor.Event{}, false
			}
			ev := supervisor.Event{Model: model, State: ps, Time: now}
			if ps == supervisor.ProcFailed || ps == supervisor.ProcStopped {
				ev.Reason = exit.String()
			}
			return ev, true
		}
	}
	return supervisor.Event{}, false
}

// eventState maps an ActiveState to the state an Event reports; transient
// states between them (reloading, deactivating) report nothing.
func eventState(active string) (supervisor.ProcState, bool) {
	switch active {
	case "active":
		return supervisor.ProcRunning, true
	case "activating":
		return supervisor.ProcStarting, true
	case "inactive":
		return supervisor.ProcStopped, true
	case "failed":
		return supervisor.ProcFailed, true
	}
	return supervisor.ProcUnknown, false
}

// procState maps a unit's load and active state to a ProcState for Status.
func procState(load, active string) supervisor.ProcState {
	if load == "not-found" {
		return supervisor.ProcStopped
	}
	switch active {
	case "active", "reloading", "deactivating":
		return supervisor.ProcRunning
	case "activating":
		return supervisor.ProcStarting
	case "inactive":
		return supervisor.ProcStopped
	case "failed":
		return supervisor.ProcFailed
	}
	return supervisor.ProcUnknown
}

// modelFromUnit is the model of a napd-engine-<model>.service unit.
func modelFromUnit(unit string) (string, bool) {
	m, ok := strings.CutPrefix(unit, supervisor.UnitPrefix)
	if !ok {
		return "", false
	}
	m, ok = strings.CutSuffix(m, ".service")
	if !ok || m == "" {
		return "", false
	}
	return m, true
}

// unescapeUnitPath turns /org/freedesktop/systemd1/unit/napd_2dengine_2dx_2eservice
// back into napd-engine-x.service (sd_bus_path_encode's "_xx" hex escapes).
func unescapeUnitPath(p godbus.ObjectPath) string {
	s := strings.TrimPrefix(string(p), unitPathNS+"/")
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '_' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
