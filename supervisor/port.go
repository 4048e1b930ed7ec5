package supervisor

import (
	"context"
	"fmt"
)

// PortHolder is a process listening on an engine's port.
type PortHolder struct {
	PID  int // 0 when napd cannot see the process (another user's, napd not root)
	Name string
	UID  uint32
}

// PortCheck lists the processes listening on 127.0.0.1:port that are not
// among engine (the engine's processes: its process group or its unit's
// cgroup, as the backend reports them). An error means the socket table
// could not be read.
type PortCheck func(port int, engine []int) ([]PortHolder, error)

// PortError is an engine's port held by another process than the engine:
// napd refuses to forward anything to it.
type PortError struct {
	Port   int
	Model  string
	Holder PortHolder
}

func (e *PortError) Error() string {
	who := fmt.Sprintf("pid %d (%s)", e.Holder.PID, e.Holder.Name)
	if e.Holder.PID == 0 {
		who = fmt.Sprintf("a process of uid %d that napd cannot see", e.Holder.UID)
	}
	return fmt.Sprintf("port %d is held by %s, not by the engine of %s", e.Port, who, e.Model)
}

// checkPort verifies that only the engine listens on spec's port: before a
// start (running is false: nothing may listen yet) and once the engine
// answers (its processes alone may listen). A table that cannot be read is
// logged and lets the wake go on: the check guards, it does not gate.
func (s *Supervisor) checkPort(ctx context.Context, spec Spec, running bool) error {
	if s.ports == nil || spec.Port == 0 {
		return nil
	}
	var engine []int
	if running {
		st, err := s.backend.Status(ctx, spec)
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		engine = st.PIDs
	}
	holders, err := s.ports(spec.Port, engine)
	if err != nil {
		s.log.Warn("cannot verify who listens on the engine's port", "model", spec.Model, "port", spec.Port, "err", err)
		return nil
	}
	if len(holders) > 0 {
		return &PortError{Port: spec.Port, Model: spec.Model, Holder: holders[0]}
	}
	return nil
}
