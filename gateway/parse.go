package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/napd/napd/agent/lease"
)

// requestFields are the only parts of a body the gateway reads.
type requestFields struct {
	Model  string
	Stream bool
}

// errAmbiguous marks a body whose routing fields the engine could read
// differently from napd: a repeated key, or a case variant ("MODEL").
var errAmbiguous = errors.New("ambiguous")

// parseBody finds `model` and `stream` in a JSON request body. Keys match
// exactly, as the engines read them (encoding/json alone would also take
// "Model"); a repeated or case-variant routing key is errAmbiguous, so napd
// never routes by one spelling while the engine reads another.
func parseBody(body []byte) (requestFields, error) {
	var f requestFields
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil {
		return f, err
	} else if t != json.Delim('{') {
		return f, fmt.Errorf("want an object, got %v", t)
	}
	seen := map[string]string{} // folded routing key → spelling seen first
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return f, err
		}
		key := t.(string) // inside an object the decoder yields only string keys here
		folded := ""
		for _, name := range []string{"model", "stream"} {
			if len(key) == len(name) && bytes.EqualFold([]byte(key), []byte(name)) {
				folded = name
			}
		}
		if folded != "" {
			if prev, dup := seen[folded]; dup {
				return f, fmt.Errorf("%w: %q and %q both given", errAmbiguous, prev, key)
			}
			seen[folded] = key
		}
		switch key {
		case "model":
			err = dec.Decode(&f.Model)
		case "stream":
			err = dec.Decode(&f.Stream)
		default:
			err = dec.Decode(&skip{})
		}
		if err != nil {
			return f, err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return f, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return f, errors.New("data after the JSON object")
	}
	for folded, spelling := range seen {
		if folded != spelling {
			return f, fmt.Errorf("%w: %q is not %q (keys are case-sensitive)", errAmbiguous, spelling, folded)
		}
	}
	return f, nil
}

// skip consumes a JSON value without keeping it (the decoder still
// validates it).
type skip struct{}

func (skip) UnmarshalJSON([]byte) error { return nil }

// parseTimeout reads X-Request-Timeout: a Go duration ("30s", "1m30s") or
// a number of seconds ("30", "2.5"). It must be positive, and stay so once
// rounded to nanoseconds: "1e-10" is an error, never "no deadline".
func parseTimeout(s string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		switch {
		case math.IsNaN(secs) || secs <= 0:
			return 0, fmt.Errorf("%s %q: must be a positive duration", HeaderRequestTimeout, s)
		case secs >= math.MaxInt64/float64(time.Second):
			// Longer than any request_timeout: the header only ever shortens.
			return math.MaxInt64, nil
		}
		if d := time.Duration(secs * float64(time.Second)); d > 0 {
			return d, nil
		}
		return 0, fmt.Errorf("%s %q: shorter than a nanosecond", HeaderRequestTimeout, s)
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
