package config

import (
	"fmt"
	"strings"
)

// Problem is one invalid setting: where it is and what is wrong with it.
type Problem struct {
	File    string
	Line    int    // 1-based; 0 when the position is not known
	Key     string // key path, e.g. "models.qwen3.sleep"; "" for syntax errors without one
	Message string
}

// String formats the problem as FILE:LINE: KEY: message, leaving out the
// parts that are not known.
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	b.WriteString(": ")
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// Errors is every problem found in one configuration file, in file order.
// Parse returns it (never empty) when the file is not valid.
type Errors []Problem

// Error prints one problem per line.
func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, p := range e {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}
