package llamaswap

import (
	"strings"

	"github.com/napd/napd/agent/config"
)

// section is the TOML of one table, or of comments between tables.
type section struct{ lines []string }

// set writes key = v, with why as a comment after it.
func (s *section) set(key string, v any, why string) {
	line := config.FormatKey(key) + " = " + config.FormatTOML(v)
	if why != "" {
		line += "  # " + strings.Join(strings.Fields(commentSafe(why)), " ")
	}
	s.lines = append(s.lines, line)
}

// comment writes text as comment lines of at most 80 columns.
func (s *section) comment(text string) {
	line := "#"
	for _, w := range strings.Fields(commentSafe(text)) {
		if len(line)+1+len(w) > 80 && line != "#" {
			s.lines = append(s.lines, line)
			line = "#  "
		}
		line += " " + w
	}
	s.lines = append(s.lines, line)
}

// commentSafe makes text fit a TOML comment, whatever a llama-swap
// config held: valid UTF-8 and no control character but tab (each other
// one, a line break included, becomes a space).
func commentSafe(text string) string {
	return strings.Map(func(r rune) rune {
		if r != '\t' && (r < 0x20 || r == 0x7f) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(text, "\uFFFD"))
}

// write appends the section under header ("" for none) to b, after a
// blank line; an empty section writes nothing.
func (s *section) write(b *strings.Builder, header string) {
	if len(s.lines) == 0 {
		return
	}
	b.WriteString("\n")
	if header != "" {
		b.WriteString(header + "\n")
	}
	for _, l := range s.lines {
		b.WriteString(l + "\n")
	}
}
