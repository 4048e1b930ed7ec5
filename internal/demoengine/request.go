package demoengine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// maxModelLen bounds max_tokens, like a model's context length.
const maxModelLen = 32768

// defaultMaxTokens is what a request without max_tokens generates.
const defaultMaxTokens = 16

// genRequest is the part of an OpenAI chat or text completion request the
// emulator reads.
type genRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Seed     *int `json:"seed"`
	Priority *int `json:"priority"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// generation is a parsed request: what to produce and how to send it.
type generation struct {
	chat         bool
	model        string
	promptTokens int
	maxTokens    int
	seed         int
	stream       bool
	includeUsage bool
	priority     *int // vLLM's priority field, nil when absent
}

// parseRequest decodes and validates a completion request body; chat
// selects /v1/chat/completions rules. The prompt's token count is its
// whitespace-separated word count.
func parseRequest(body io.Reader, chat bool) (generation, error) {
	var req genRequest
	dec := json.NewDecoder(body)
	if err := dec.Decode(&req); err != nil {
		return generation{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	g := generation{chat: chat, model: req.Model, stream: req.Stream, maxTokens: defaultMaxTokens}
	var err error
	if chat {
		if len(req.Messages) == 0 {
			return generation{}, errors.New("messages: at least one message is required")
		}
		for i, m := range req.Messages {
			n, err := contentTokens(m.Content)
			if err != nil {
				return generation{}, fmt.Errorf("messages[%d].content: %w", i, err)
			}
			g.promptTokens += n
		}
	} else if g.promptTokens, err = promptTokens(req.Prompt); err != nil {
		return generation{}, fmt.Errorf("prompt: %w", err)
	}
	limit := req.MaxTokens
	if chat && req.MaxCompletionTokens != nil {
		limit = req.MaxCompletionTokens
	}
	if limit != nil {
		if *limit < 1 || *limit > maxModelLen {
			return generation{}, fmt.Errorf("max_tokens must be between 1 and %d, got %d", maxModelLen, *limit)
		}
		g.maxTokens = *limit
	}
	g.seed = g.promptTokens
	if req.Seed != nil {
		g.seed = *req.Seed
	}
	g.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	g.priority = req.Priority
	return g, nil
}

// contentTokens counts a chat message content: a string or an array of
// parts, of which the "text" ones count.
func contentTokens(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return len(strings.Fields(s)), nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, errors.New("want a string or an array of content parts")
	}
	n := 0
	for _, p := range parts {
		n += len(strings.Fields(p.Text))
	}
	return n, nil
}

// promptTokens counts a completion prompt: a string, an array of strings,
// an array of token ids or an array of such arrays.
func promptTokens(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, errors.New("a prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return len(strings.Fields(s)), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		n := 0
		for _, s := range ss {
			n += len(strings.Fields(s))
		}
		return n, nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return len(ids), nil
	}
	var batches [][]int
	if json.Unmarshal(raw, &batches) == nil {
		n := 0
		for _, b := range batches {
			n += len(b)
		}
		return n, nil
	}
	return 0, errors.New("want a string, an array of strings or an array of token ids")
}

// token is the text of the i-th generated token: "tok<seed+i>", with a
// leading space after the first so that chunks concatenate to the text.
func (g generation) token(i int) string {
	if i == 0 {
		return fmt.Sprintf("tok%d", g.seed)
	}
	return fmt.Sprintf(" tok%d", g.seed+i)
}

// text is the whole completion.
func (g generation) text() string {
	var b strings.Builder
	for i := range g.maxTokens {
		b.WriteString(g.token(i))
	}
	return b.String()
}
