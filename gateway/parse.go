package gateway

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/napd/napd/agent/lease"
)

// requestFields are the only parts of a body the gateway reads.
type requestFields struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
}

// parseBody finds `model` and `stream` in a JSON request body.
func parseBody(body []byte) (requestFields, error) {
	var f requestFields
	err := json.Unmarshal(body, &f)
	return f, err
}

// parseTimeout reads X-Request-Timeout: a Go duration ("30s", "1m30s") or
// a number of seconds ("30", "2.5"). It must be positive.
func parseTimeout(s string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		switch {
		case math.IsNaN(secs) || secs <= 0:
			return 0, fmt.Errorf("%s %q: must be a positive duration", HeaderRequestTimeout, s)
		case secs >= math.MaxInt64/float64(time.Second):
			// Longer than any request_timeout: the header only ever shortens.
			return math.MaxInt64, nil
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a duration like \"30s\" or seconds like \"30\"", HeaderRequestTimeout, s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%s %q: must be a positive duration", HeaderRequestTimeout, s)
	}
	return d, nil
}

// kindOf classifies a request by its engine path.
func kindOf(path string) lease.Kind {
	switch path {
	case "/v1/chat/completions", "/v1/messages":
		return lease.KindChat
	case "/v1/completions", "/completion", "/infill":
		return lease.KindCompletion
	case "/v1/embeddings", "/embedding":
		return lease.KindEmbedding
	}
	return lease.KindOther
}
