package config

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// FormatTOML writes v as a TOML value: a string, an integer, a float, a
// boolean, an array of them or a table (inline, keys sorted). It is how
// `napctl config show` and `napctl import` write values.
func FormatTOML(v any) string {
	switch x := v.(type) {
	case string:
		return quote(x)
	case bool:
		return strconv.FormatBool(x)
	case int:
		return strconv.Itoa(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		switch {
		case math.IsInf(x, 1):
			return "inf"
		case math.IsInf(x, -1):
			return "-inf"
		case math.IsNaN(x):
			return "nan"
		}
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEn") {
			s += ".0"
		}
		return s
	case []string:
		return formatArray(len(x), func(i int) string { return quote(x[i]) })
	case []any:
		return formatArray(len(x), func(i int) string { return FormatTOML(x[i]) })
	case map[string]string:
		return formatTable(slices.Sorted(maps.Keys(x)), func(k string) string { return quote(x[k]) })
	case map[string]any:
		return formatTable(slices.Sorted(maps.Keys(x)), func(k string) string { return FormatTOML(x[k]) })
	}
	panic(fmt.Sprintf("config: FormatTOML of %T", v))
}

func formatArray(n int, el func(int) string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = el(i)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatTable(keys []string, val func(string) string) string {
	if len(keys) == 0 {
		return "{}"
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = FormatKey(k) + " = " + val(k)
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

var bareKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// FormatKey writes a key bare when TOML allows it, else quoted.
func FormatKey(k string) string {
	if bareKey.MatchString(k) {
		return k
	}
	return quote(k)
}

// quote writes a TOML basic string: only ", \ and control characters are
// escaped (TOML has no \x escape, so Go's strconv.Quote will not do).
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\t':
			b.WriteString(`\t`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < ' ' || r == 0x7f {
				fmt.Fprintf(&b, `\u%04X`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
