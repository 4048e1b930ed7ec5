package gateway

import (
	"fmt"
	"net/http"
	"strconv"
)

// modelHealthPrefix is the per-model readiness route of balancers that
// have no agent check: GET /health/models/NAME.
const modelHealthPrefix = "/health/models/"

// modelHealthBody is the answer of GET /health/models/NAME.
type modelHealthBody struct {
	Model      string `json:"model"`
	State      string `json:"state"`
	Reason     string `json:"reason,omitempty"`
	Serving    bool   `json:"serving"`
	QueueDepth int    `json:"queue_depth"`
}

// modelHealth answers 200 when the model serves now, else 503 with
// Retry-After, the state in the body either way; 404 for no such model.
// It is not a request for the model: it wakes nothing and is not counted
// in the model's request metrics. With API keys on it needs one, like
// /v1/models: model names are for the keys that may use them.
func (c *call) modelHealth(r *http.Request, name string) {
	c.probe = true
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		c.fail(http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+modelHealthPrefix)
		return
	}
	if model, ok := c.resolve(name); ok {
		for _, m := range c.g.models.List() {
			if m.Name != model {
				continue
			}
			depth := c.g.models.QueueDepth(model)
			c.w.Header().Set(HeaderQueueDepth, strconv.Itoa(depth))
			status := http.StatusOK
			if !m.Serving {
				status = http.StatusServiceUnavailable
				setRetryAfter(c.w.Header(), defaultRetryAfter)
			}
			c.writeValue(status, modelHealthBody{Model: m.Name, State: m.State, Reason: m.Reason, Serving: m.Serving, QueueDepth: depth})
			return
		}
		// Removed by a reload between Resolve and List.
		c.fail(http.StatusNotFound, "model_not_found", fmt.Sprintf("model %q does not exist", name))
	}
}
