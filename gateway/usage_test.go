package gateway

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func scanAll(chunks ...string) (Usage, bool) {
	var s UsageScanner
	for _, c := range chunks {
		_, _ = s.Write([]byte(c))
	}
	return s.Usage()
}

func TestUsageScanner(t *testing.T) {
	plain := `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi \"usage\":{\"prompt_tokens\":99}"}}],` +
		`"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}`
	stream := "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n" +
		"data: [DONE]\n\n"
	cases := []struct {
		name string
		body string
		want Usage
		ok   bool
	}{
		{"plain", plain, Usage{12, 7}, true},
		{"stream, last chunk wins", stream, Usage{5, 2}, true},
		{"embedding", `{"data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":4,"total_tokens":4}}`, Usage{4, 0}, true},
		{"spaces", "{\"usage\" :\n {\"prompt_tokens\" : 3 , \"completion_tokens\":1 } }", Usage{3, 1}, true},
		{"none", `{"choices":[{"text":"usage"}]}`, Usage{}, false},
		{"null", `{"usage":null}`, Usage{}, false},
		{"escaped key in content", `{"content":"\"usage\":{\"prompt_tokens\":9}"}`, Usage{}, false},
		{"negative", `{"usage":{"prompt_tokens":-1,"completion_tokens":2}}`, Usage{}, false},
		{"not numbers", `{"usage":{"prompt_tokens":"x"}}`, Usage{}, false},
		{"too large", `{"usage":{"prompt_tokens":1,"pad":"` + strings.Repeat("x", 2*maxUsageObject) + `"}}`, Usage{}, false},
		{"after a too large one", `{"usage":{"pad":"` + strings.Repeat("}", 2*maxUsageObject) + `"},"x":{"usage":{"prompt_tokens":2}}}`, Usage{2, 0}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Whole, and split at every byte boundary into two writes.
			for i := 0; i <= len(tc.body); i++ {
				got, ok := scanAll(tc.body[:i], tc.body[i:])
				if got != tc.want || ok != tc.ok {
					t.Fatalf("split at %d: got %+v %v, want %+v %v", i, got, ok, tc.want, tc.ok)
				}
			}
			chunks := make([]string, 0, len(tc.body))
			for _, c := range tc.body {
				chunks = append(chunks, string(c))
			}
			if got, ok := scanAll(chunks...); got != tc.want || ok != tc.ok {
				t.Fatalf("byte by byte: got %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzUsageScanner: however a body is cut into writes, the scanner finds
// the same usage as when it reads the body at once, and never panics.
func FuzzUsageScanner(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":2}}`), uint8(3))
	f.Add([]byte("data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":5}}\n\n"), uint8(7))
	f.Add([]byte(`\"usage\":{"prompt_tokens":1}`), uint8(1))
	f.Add([]byte(`""usage""usage":{{}}`), uint8(2))
	f.Fuzz(func(t *testing.T, body []byte, step uint8) {
		want, wantOK := scanAll(string(body))
		n := int(step%16) + 1
		var s UsageScanner
		for i := 0; i < len(body); i += n {
			_, _ = s.Write(body[i:min(i+n, len(body))])
		}
		if got, ok := s.Usage(); got != want || ok != wantOK {
			t.Errorf("in writes of %d: %+v %v, at once: %+v %v", n, got, ok, want, wantOK)
		}
		if want.PromptTokens < 0 || want.CompletionTokens < 0 {
			t.Errorf("negative counts %+v", want)
		}
	})
}

// BenchmarkUsageScanner: the scan of a 50-chunk stream whose last chunk
// carries the usage (the cost every streamed answer pays).
func BenchmarkUsageScanner(b *testing.B) {
	var chunks [][]byte
	for i := range 50 {
		chunks = append(chunks, []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764550000,"model":"qwen3-8b","choices":[{"index":0,"delta":{"content":" tok`+strconv.Itoa(i)+`"},"logprobs":null,"finish_reason":null}],"usage":null}`+"\n\n"))
	}
	chunks = append(chunks, []byte(`data: {"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":21,"total_tokens":71,"completion_tokens":50}}`+"\n\ndata: [DONE]\n\n"))
	b.ReportAllocs()
	for b.Loop() {
		var s UsageScanner
		for _, c := range chunks {
			_, _ = s.Write(c)
		}
		if _, ok := s.Usage(); !ok {
			b.Fatal("no usage")
		}
	}
}

// BenchmarkUsageScannerPlain: the scan of a plain answer with its usage.
func BenchmarkUsageScannerPlain(b *testing.B) {
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1764550000,"model":"qwen3-8b",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"logprobs":null,"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":21,"total_tokens":45,"completion_tokens":24,"prompt_tokens_details":null}}`)
	b.ReportAllocs()
	for b.Loop() {
		var s UsageScanner
		_, _ = s.Write(answer)
		if _, ok := s.Usage(); !ok {
			b.Fatal("no usage")
		}
	}
}

// FuzzPlainUsage: what plainUsage reads is what json.Unmarshal reads.
func FuzzPlainUsage(f *testing.F) {
	for _, s := range []string{`{"prompt_tokens":1,"completion_tokens":2}`, `{"prompt_tokens":null}`, `{"prompt_tokens":1.0}`,
		`{"Prompt_Tokens":3}`, `{"prompt_tokens":1,"prompt_tokens":-2}`, `{"prompt_tokens":99999999999999999999}`,
		`{"x":{"prompt_tokens":1},"completion_tokens":"2"}`, `{"prompt_tokens":1e2}`, `{"prompt\u005ftokens":1}`, `{"prompt_tokens":1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		if len(obj) == 0 || obj[0] != '{' {
			return // the scanner captures objects only
		}
		c, ok := plainUsage(obj)
		if !ok {
			return
		}
		var u usageFields
		if err := json.Unmarshal(obj, &u); err != nil {
			t.Fatalf("plainUsage read %q, which json.Unmarshal refuses: %v", obj, err)
		}
		if (u.PromptTokens != nil) != c.hasPrompt || (u.PromptTokens != nil && *u.PromptTokens != c.prompt) ||
			(u.CompletionTokens != nil) != c.hasCompletion || (u.CompletionTokens != nil && *u.CompletionTokens != c.completion) {
			t.Fatalf("plainUsage(%q) = %+v, json.Unmarshal %v %v", obj, c, u.PromptTokens, u.CompletionTokens)
		}
	})
}
