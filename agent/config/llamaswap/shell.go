package llamaswap

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// splitCommand splits a llama-swap cmd into an argv the way a POSIX shell
// splits words, without any expansion: blanks and newlines separate
// words; '…' quotes literally; "…" quotes with \", \\, \$ and \` escapes;
// a backslash outside quotes escapes the next character, and a backslash
// before a newline continues the line; a # that starts a word comments out
// the rest of its line (llama-swap drops such lines too). line is the
// 1-based line in s of an error.
func splitCommand(s string) (argv []string, line int, err error) {
	var cur strings.Builder
	inWord := false
	lineAt := func(i int) int { return strings.Count(s[:i], "\n") + 1 }
	end := func() {
		if inWord {
			argv = append(argv, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			switch {
			case i+1 == len(s):
				cur.WriteByte(c)
				inWord = true
			case s[i+1] == '\n':
				i++
			default:
				cur.WriteByte(s[i+1])
				i++
				inWord = true
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, lineAt(i), errors.New("a ' that is not closed")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			start := i
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`\n", s[i+1]) >= 0 {
					if s[i+1] != '\n' {
						cur.WriteByte(s[i+1])
					}
					i++
					continue
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, lineAt(start), errors.New(`a " that is not closed`)
			}
			inWord = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			end()
		case c == '#' && !inWord:
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				i = len(s)
			} else {
				i += j - 1 // the newline ends no word: next round skips it
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	end()
	return argv, 0, nil
}

// macroRE is a llama-swap macro reference.
var macroRE = regexp.MustCompile(`\$\{([A-Za-z0-9_.-]+)\}`)

// maxExpansion bounds what one string's macros expand to: macros that
// double at each level must not exhaust memory.
const maxExpansion = 1 << 20

// macros expands llama-swap macros: a model's own first, then the
// file's; a macro's value may use other macros. ${PORT} stays for napd,
// ${MODEL_ID} becomes the model's llama-swap name.
type macros struct {
	own, global map[string]string
	id          string
}

func (m macros) expand(s string) (string, error) { return m.expandIn(s, nil) }

func (m macros) expandIn(s string, active []string) (string, error) {
	var err error
	grown := 0 // bytes the references added so far
	out := macroRE.ReplaceAllStringFunc(s, func(ref string) string {
		if err != nil {
			return ""
		}
		name := ref[2 : len(ref)-1]
		switch name {
		case "PORT":
			return ref
		case "MODEL_ID":
			return m.id
		}
		v, ok := m.own[name]
		if !ok {
			v, ok = m.global[name]
		}
		if !ok {
			err = fmt.Errorf("unknown macro ${%s}", name)
			return ""
		}
		for _, a := range active {
			if a == name {
				err = fmt.Errorf("macros %s refer to each other", strings.Join(append(active, name), " -> "))
				return ""
			}
		}
		var x string
		x, err = m.expandIn(v, append(slices.Clone(active), name))
		if grown += len(x); err == nil && len(s)+grown > maxExpansion {
			err = fmt.Errorf("macros expand to more than %d bytes", maxExpansion)
		}
		return x
	})
	return out, err
}
