package container

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/napd/napd/supervisor"
)

// maxInspect bounds the runtime answers napd parses (an inspect of one
// container is a few KiB; a list of napd's, at most a few hundred).
const maxInspect = 4 << 20

// inspected is what napd reads of `container inspect`: the fields podman
// and docker name alike.
type inspected struct {
	ID    string `json:"Id"`
	Name  string `json:"Name"` // docker: "/name"
	State struct {
		Status    string `json:"Status"` // created, running, paused, exited, …
		Running   bool   `json:"Running"`
		Pid       int    `json:"Pid"`
		ConmonPid int    `json:"ConmonPid"` // podman only
		ExitCode  int    `json:"ExitCode"`
		OOMKilled bool   `json:"OOMKilled"`
		Error     string `json:"Error"`
	} `json:"State"`
	ConmonPidFile string `json:"ConmonPidFile"` // podman only
	Config        struct {
		Labels map[string]string `json:"Labels"`
	} `json:"Config"`
	NetworkSettings struct {
		IPAddress string `json:"IPAddress"`
	} `json:"NetworkSettings"`
}

// parseInspect parses the JSON array `container inspect` prints.
func parseInspect(data []byte) ([]inspected, error) {
	if len(data) > maxInspect {
		return nil, fmt.Errorf("inspect: %d bytes, more than %d", len(data), maxInspect)
	}
	var out []inspected
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	for i := range out {
		out[i].Name = strings.TrimPrefix(out[i].Name, "/")
		if out[i].ID == "" {
			return nil, errors.New("inspect: a container without an Id")
		}
	}
	return out, nil
}

// model is the model the container runs for, when instance's napd created
// it; "" otherwise.
func (c *inspected) model(instance string) string {
	l := c.Config.Labels
	if l[LabelInstance] != instance {
		return ""
	}
	return l[LabelModel]
}

// procState maps the runtime's status to the supervisor's.
func (c *inspected) procState() supervisor.ProcState {
	switch c.State.Status {
	case "running", "paused", "restarting", "stopping":
		return supervisor.ProcRunning
	case "created", "configured", "initialized":
		return supervisor.ProcStarting
	case "exited", "stopped", "dead", "removing":
		return supervisor.ProcFailed
	}
	if c.State.Running {
		return supervisor.ProcRunning
	}
	return supervisor.ProcUnknown
}

// exitReason says how the container ended: its exit code, an OOM kill,
// the runtime's own error (docker records why a start failed).
func (c *inspected) exitReason() string {
	var parts []string
	switch {
	case c.State.OOMKilled:
		parts = append(parts, "killed for want of memory (OOM)")
	case c.State.Status == "created":
		parts = append(parts, "never started")
	default:
		parts = append(parts, "exit code "+strconv.Itoa(c.State.ExitCode))
	}
	if e := strings.TrimSpace(c.State.Error); e != "" {
		parts = append(parts, e)
	}
	return strings.Join(parts, ": ")
}
