package measure

import (
	"context"
	"fmt"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/estimate"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/probes/procio"
	"github.com/napd/napd/supervisor"
)

// LoadMeter measures a waking engine's load for the model loop
// (model.LoadMeter): what the engine's processes, as the supervisor finds
// them (the unit's cgroup, the process group, the container's), have read,
// against the weight files its command names.
type LoadMeter struct {
	Supervisor interface {
		Status(ctx context.Context, spec supervisor.Spec) (supervisor.Status, error)
	}
	Proc procio.Reader
}

// Weights implements model.LoadMeter: the model's weight files as
// estimate finds them (those its command names, and its weights key).
func (l LoadMeter) Weights(cfg *config.Model, spec supervisor.Spec) int64 {
	var total int64
	for _, f := range estimate.WeightFiles(spec.Command, cfg.Weights) {
		total += f.Size
	}
	return total
}

// Read implements model.LoadMeter. An engine with no process (not started
// yet) has read nothing.
func (l LoadMeter) Read(ctx context.Context, spec supervisor.Spec) (loadprogress.Counts, error) {
	st, err := l.Supervisor.Status(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("load of %s: %w", spec.Model, err)
	}
	if len(st.PIDs) == 0 {
		return loadprogress.Counts{}, nil
	}
	counts, err := l.Proc.Read(st.PIDs)
	if err != nil {
		return nil, fmt.Errorf("load of %s: %w", spec.Model, err)
	}
	return counts, nil
}
