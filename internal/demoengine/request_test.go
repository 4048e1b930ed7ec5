package demoengine

import (
	"strings"
	"testing"
)

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"demo","messages":[{"role":"user","content":"hi there"}],"max_tokens":3,"stream":true}`,
		`{"messages":[{"content":[{"type":"text","text":"a b"},{"type":"image_url"}]}]}`,
		`{"prompt":[[1,2],[3]],"seed":-5}`,
		`{"prompt":["a","b c"],"max_tokens":32768}`,
		`{"prompt":"x","stream_options":{"include_usage":true},"stream":true}`,
		`{`,
		`null`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		g, err := parseRequest(strings.NewReader(body), chat)
		if err != nil {
			return
		}
		if g.maxTokens < 1 || g.maxTokens > maxModelLen || g.promptTokens < 0 {
			t.Fatalf("accepted %q as %+v", body, g)
		}
		if words := strings.Fields(g.text()); len(words) != g.maxTokens {
			t.Fatalf("text has %d tokens, want %d", len(words), g.maxTokens)
		}
	})
}
