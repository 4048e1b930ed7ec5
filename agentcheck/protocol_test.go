package agentcheck

import (
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Request
		err  string
	}{
		{"qwen\n", Request{Model: "qwen"}, ""},
		{"qwen\r\n", Request{Model: "qwen"}, ""},
		{"qwen", Request{Model: "qwen"}, ""},
		{"Qwen/Qwen3-8B\n", Request{Model: "Qwen/Qwen3-8B"}, ""},
		{"qwen awake\n", Request{Model: "qwen", Mode: ModeAwake}, ""},
		{" qwen\tawake \n", Request{Model: "qwen", Mode: ModeAwake}, ""},
		{"\n", Request{}, "empty request"},
		{"qwen asleep\n", Request{}, `unknown mode "asleep"`},
		{"a b c\n", Request{}, "3 words"},
		{"qw\x00en\n", Request{}, "byte 0x00"},
		{"qwen\n\n", Request{}, "byte 0x0a"},
		{"qw\xc3\xa9n\n", Request{}, "byte 0xc3"},
	} {
		got, err := ParseRequest(tc.line)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseRequest(%q) error = %v, want %q", tc.line, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRequest(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
}

// TestAnswer_EachState is the table a balancer sees: awake (or waking)
// takes everything, a sleeping model a little (nothing when asked in
// awake mode), draining and failed ones nothing.
func TestAnswer_EachState(t *testing.T) {
	wake, awake := Request{Model: "m"}, Request{Model: "m", Mode: ModeAwake}
	for _, tc := range []struct {
		req   Request
		st    Status
		known bool
		want  string
	}{
		{wake, Status{Serving, "awake", 0}, true, "up ready 100% #awake, 0 queued\n"},
		{awake, Status{Serving, "waking", 3}, true, "up ready 100% #waking, 3 queued\n"},
		{wake, Status{Wakeable, "sleeping", 0}, true, "up ready 1% #sleeping, 0 queued\n"},
		{awake, Status{Wakeable, "unverified", 0}, true, "up ready 0% #unverified, 0 queued\n"},
		{wake, Status{Draining, "draining", 2}, true, "up drain #draining, 2 queued\n"},
		{awake, Status{Draining, "draining", 0}, true, "up drain #draining, 0 queued\n"},
		{wake, Status{Failed, "failed", 0}, true, "down #failed, 0 queued\n"},
		{awake, Status{Failed, "failed", 0}, true, "down #failed, 0 queued\n"},
		{wake, Status{}, false, "down #no model m\n"},
		{awake, Status{Health: Unknown, State: "State(9)"}, true, "down #State(9), 0 queued\n"},
	} {
		if got := Answer(tc.req, tc.st, tc.known); got != tc.want {
			t.Errorf("Answer(%+v, %+v, %v) = %q, want %q", tc.req, tc.st, tc.known, got, tc.want)
		}
	}
}
