package gateway

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Usage is the token count an engine reported for one request, read from
// the last `usage` object of its answer (the body of a plain answer, the
// final chunk of a stream sent with stream_options.include_usage).
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
}

// UsageScanner finds the last `"usage": {…}` object in a response body as
// it streams through (the zero value is ready to use), without keeping the body: only the small object
// itself is buffered, up to maxUsageObject bytes (a larger one is skipped).
// It reads counts only; no other byte of the answer is kept or logged.
//
// In valid JSON the bytes `"usage"` followed by `:` can only be a key: the
// same word inside a string has its quotes escaped. A key named usage at
// any depth counts; the engines put it at the top level of the answer or
// of each chunk.
type UsageScanner struct {
	state    scanState
	matched  int    // bytes of usageKey matched so far (stateKey)
	prevEsc  bool   // the byte before the match was a backslash
	obj      []byte // the object being captured (stateObject): in room when it fits
	room     [256]byte
	depth    int
	inString bool
	escape   bool
	last     Usage
	found    bool
}

type scanState uint8

const (
	stateSearch scanState = iota // looking for usageKey
	stateColon                   // after the key: whitespace, then ':'
	stateValue                   // after ':': whitespace, then '{'
	stateObject                  // inside the object, capturing
	stateSkip                    // inside an object too large to capture
)

var usageKey = []byte(`"usage"`)

// maxUsageObject bounds a captured usage object; vLLM's, with its details,
// is under 200 bytes.
const maxUsageObject = 1024

// Write feeds the next bytes of the body. It never fails.
func (s *UsageScanner) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		switch s.state {
		case stateSearch:
			p = s.search(p)
		case stateColon, stateValue:
			switch c := p[0]; {
			case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			case s.state == stateColon && c == ':':
				s.state = stateValue
			case s.state == stateValue && c == '{':
				s.state, s.depth, s.inString, s.escape = stateObject, 1, false, false
				if s.obj == nil {
					// A usual object fits the scanner's own room (not to
					// be copied while in use).
					s.obj = s.room[:0]
				}
				s.obj = append(s.obj[:0], '{')
			default:
				// Not an object (vLLM sends "usage":null in chunks without
				// one): search again from this byte.
				s.state, s.prevEsc = stateSearch, false
				continue
			}
			p = p[1:]
		case stateObject, stateSkip:
			p = s.object(p)
		}
	}
	return n, nil
}

// search looks for usageKey, across writes, and returns what follows it.
func (s *UsageScanner) search(p []byte) []byte {
	if s.matched > 0 {
		// Continue a match split by the previous write.
		k := min(len(usageKey)-s.matched, len(p))
		if bytes.Equal(p[:k], usageKey[s.matched:s.matched+k]) {
			s.matched += k
			if s.matched < len(usageKey) {
				return nil
			}
			s.matched = 0
			s.state = stateColon
			return p[k:]
		}
		s.matched, s.prevEsc = 0, false
		// A restart of the match inside the failed one can only begin at
		// a quote, which the plain search below finds.
	}
	for {
		i := indexKey(p)
		if i < 0 {
			s.partial(p)
			return nil
		}
		esc := s.prevEsc
		if i > 0 {
			esc = p[i-1] == '\\'
		}
		if !esc {
			s.state = stateColon
			return p[i+len(usageKey):]
		}
		// An escaped quote inside a string: look past it.
		s.prevEsc = false
		p = p[i+1:]
	}
}

// indexKey is bytes.Index(p, usageKey), anchored on the key's u rather
// than its quote: a quote is JSON's commonest byte, and a scan for the
// first byte stops at each.
func indexKey(p []byte) int {
	for off := 1; off < len(p); {
		j := bytes.Index(p[off:], usageKey[1:])
		if j < 0 {
			return -1
		}
		if j += off; p[j-1] == '"' {
			return j - 1
		}
		off = j + 1
	}
	return -1
}

// partial remembers how much of usageKey the end of p begins, for the next
// write to finish the match, and whether p ends with a backslash.
func (s *UsageScanner) partial(p []byte) {
	if len(p) == 0 {
		s.prevEsc = false // p ended at the quote searched past
		return
	}
	before := s.prevEsc // the byte before p
	s.prevEsc = p[len(p)-1] == '\\'
	// Only the key's first byte is a quote: the tail that may begin the key
	// starts at the last quote among the last len(usageKey)-1 bytes.
	tail := p[max(len(p)-(len(usageKey)-1), 0):]
	q := bytes.LastIndexByte(tail, '"')
	if q < 0 || !bytes.HasPrefix(usageKey, tail[q:]) {
		return
	}
	k := len(tail) - q
	esc := before
	if len(p) > k {
		esc = p[len(p)-k-1] == '\\'
	}
	if !esc {
		s.matched = k
	}
}

// object captures the usage object up to its closing brace.
func (s *UsageScanner) object(p []byte) []byte {
	for i, c := range p {
		switch {
		case s.escape:
			s.escape = false
		case s.inString:
			switch c {
			case '\\':
				s.escape = true
			case '"':
				s.inString = false
			}
		case c == '"':
			s.inString = true
		case c == '{':
			s.depth++
		case c == '}':
			s.depth--
		}
		if s.depth == 0 {
			if s.state == stateObject && len(s.obj)+i+1 <= maxUsageObject {
				s.obj = append(s.obj, p[:i+1]...)
				s.parse()
			}
			s.state, s.prevEsc = stateSearch, false
			return p[i+1:]
		}
	}
	if s.state == stateObject {
		if len(s.obj)+len(p) > maxUsageObject {
			s.state, s.obj = stateSkip, s.obj[:0]
		} else {
			s.obj = append(s.obj, p...)
		}
	}
	return nil
}

// usageFields are the counts read; other fields of the object are ignored.
type usageFields struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
}

func (s *UsageScanner) parse() {
	c, ok := plainUsage(s.obj)
	if !ok {
		var f usageFields
		if json.Unmarshal(s.obj, &f) != nil {
			return
		}
		c = usageCounts{hasPrompt: f.PromptTokens != nil, hasCompletion: f.CompletionTokens != nil}
		if c.hasPrompt {
			c.prompt = *f.PromptTokens
		}
		if c.hasCompletion {
			c.completion = *f.CompletionTokens
		}
	}
	if !c.hasPrompt || c.prompt < 0 {
		return
	}
	u := Usage{PromptTokens: c.prompt}
	if c.hasCompletion && c.completion >= 0 {
		u.CompletionTokens = c.completion // embeddings have none
	}
	s.last, s.found = u, true
}

// usageCounts are usageFields without the pointers.
type usageCounts struct {
	prompt, completion       int64
	hasPrompt, hasCompletion bool
}

var (
	promptTokensKey     = []byte("prompt_tokens")
	completionTokensKey = []byte("completion_tokens")
)

// plainUsage reads a usage object as json.Unmarshal would, without its
// reflection and allocations, when the object is plain: valid, counts
// that are integers or null under their exact keys, no other key that
// encoding/json would fold onto theirs, no escaped key. It reports false
// for any other object, which json.Unmarshal then reads (or refuses).
func plainUsage(obj []byte) (c usageCounts, ok bool) {
	if !validJSON(obj) {
		return c, false
	}
	sc := scanner{b: obj}
	sc.next() // '{'
	sc.i++
	for {
		tok, val, more := sc.member()
		if !more {
			return c, true
		}
		key := tok[1 : len(tok)-1]
		var n *int64
		var has *bool
		switch {
		case bytes.IndexByte(key, '\\') >= 0:
			return c, false
		case bytes.Equal(key, promptTokensKey):
			n, has = &c.prompt, &c.hasPrompt
		case bytes.Equal(key, completionTokensKey):
			n, has = &c.completion, &c.hasCompletion
		case bytes.EqualFold(key, promptTokensKey), bytes.EqualFold(key, completionTokensKey):
			return c, false
		default:
			continue
		}
		if string(val) == "null" {
			*n, *has = 0, false
			continue
		}
		if bytes.ContainsAny(val, ".eE") {
			return c, false
		}
		v, err := strconv.ParseInt(string(val), 10, 64)
		if err != nil {
			return c, false // not a number, or out of range
		}
		*n, *has = v, true
	}
}

// Usage is the last complete usage object seen, if any.
func (s *UsageScanner) Usage() (Usage, bool) { return s.last, s.found }
