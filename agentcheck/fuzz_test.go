package agentcheck

import (
	"strings"
	"testing"
)

// FuzzParseRequest: any bytes either parse into a model name HAProxy's
// answer can carry on one line, or are refused with a one-line `down`.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{"qwen\n", "qwen awake\r\n", "Qwen/Qwen3-8B\n", " a\tawake\n", "\n", "a b c", "\x00\n", "#\n", "é\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		req, err := ParseRequest(line)
		if err != nil {
			if r := refusal(err); !oneLine(r) || !strings.HasPrefix(r, "down #") {
				t.Errorf("refusal of %q = %q, want one `down` line", line, r)
			}
			return
		}
		if req.Model == "" || strings.ContainsAny(req.Model, " \t\r\n") {
			t.Errorf("ParseRequest(%q) model = %q", line, req.Model)
		}
		for _, c := range []byte(req.Model) {
			if c < ' ' || c >= 0x7f {
				t.Errorf("ParseRequest(%q) model %q has byte 0x%02x", line, req.Model, c)
			}
		}
		if req.Mode != ModeWake && req.Mode != ModeAwake {
			t.Errorf("ParseRequest(%q) mode = %d", line, req.Mode)
		}
		for _, known := range []bool{true, false} {
			if a := Answer(req, Status{Health: Serving, State: "awake"}, known); !oneLine(a) {
				t.Errorf("answer to %q = %q, want one line", line, a)
			}
		}
	})
}

func oneLine(s string) bool {
	return strings.HasSuffix(s, "\n") && strings.Count(s, "\n") == 1 && !strings.Contains(s, "\r")
}
