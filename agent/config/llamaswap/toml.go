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
		line += "  # " + why
	}
	s.lines = append(s.lines, line)
}

// comment writes text as comment lines of at most 80 columns.
func (s *section) comment(text string) {
	line := "#"
	for _, w := range strings.Fields(text) {
		if len(line)+1+len(w) > 80 && line != "#" {
			s.lines = append(s.lines, line)
			line = "#  "
		}
		line += " " + w
	}
	s.lines = append(s.lines, line)
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
