//go:build linux

package host

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// PSI is the kernel's pressure stall information for memory
// (/proc/pressure/memory): the share of time some or all tasks stalled on
// memory, averaged over 10, 60 and 300 seconds.
type PSI struct {
	Some PSILine
	Full PSILine
}

// PSILine is one line of a PSI file. Averages are percentages (0–100);
// Total is the cumulative stall time in microseconds.
type PSILine struct {
	Avg10  float64
	Avg60  float64
	Avg300 float64
	Total  uint64
}

// ParsePSI parses the text of /proc/pressure/memory:
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//
// A "some" line is required; "full" is optional (older kernels printed only
// "some" for the cpu file, and being lenient costs nothing). Unknown keys are
// ignored so that a newer kernel adding a field does not break napd.
func ParsePSI(text []byte) (PSI, error) {
	var psi PSI
	var haveSome bool
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		var dst *PSILine
		switch fields[0] {
		case "some":
			dst, haveSome = &psi.Some, true
		case "full":
			dst = &psi.Full
		default:
			return PSI{}, fmt.Errorf("psi line %d: unknown kind %q", n, fields[0])
		}
		if err := parsePSILine(fields[1:], dst); err != nil {
			return PSI{}, fmt.Errorf("psi line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return PSI{}, fmt.Errorf("psi: %w", err)
	}
	if !haveSome {
		return PSI{}, fmt.Errorf("psi: no \"some\" line")
	}
	return psi, nil
}

func parsePSILine(fields []string, dst *PSILine) error {
	for _, f := range fields {
		key, val, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("field %q is not key=value", f)
		}
		var err error
		switch key {
		case "avg10":
			dst.Avg10, err = parseAvg(val)
		case "avg60":
			dst.Avg60, err = parseAvg(val)
		case "avg300":
			dst.Avg300, err = parseAvg(val)
		case "total":
			dst.Total, err = strconv.ParseUint(val, 10, 64)
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	return nil
}

func parseAvg(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, err
	}
	if !(v >= 0 && v <= 100) { // also rejects NaN
		return 0, fmt.Errorf("%q is not a percentage", s)
	}
	return v, nil
}
