package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// setWarmWeights decodes [policy] warm_weights: "auto", "off" or a size.
func setWarmWeights(dst *int64) setter {
	return setter{get: func() any {
		switch *dst {
		case WarmWeightsAuto:
			return "auto"
		case 0:
			return "off"
		}
		return FormatSize(*dst)
	}, set: func(raw any) error {
		s, ok := raw.(string)
		if !ok {
			return wantType(`"auto", "off" or a size string such as "64GiB"`, raw)
		}
		switch s {
		case "auto":
			*dst = WarmWeightsAuto
			return nil
		case "off":
			*dst = 0
			return nil
		}
		n, err := ParseSize(s)
		if err != nil {
			return fmt.Errorf(`want "auto", "off" or a size: %w`, err)
		}
		if n == 0 {
			return errors.New(`a size of 0 keeps nothing warm: write "off"`)
		}
		*dst = n
		return nil
	}}
}

// checkWeights resolves the model's weights paths (relative ones against
// working_directory) and checks each names a readable regular file or a
// directory: a wrong path would keep nothing warm without a word.
func (d *decoder) checkWeights(m *Model, t *table) {
	for i, p := range m.Weights {
		if !filepath.IsAbs(p) {
			if m.WorkingDirectory == "" {
				d.addAt(t.at("weights"), fmt.Sprintf("element %d: %q is a relative path and working_directory is not set: give an absolute path", i, p))
				continue
			}
			p = filepath.Join(m.WorkingDirectory, p)
			m.Weights[i] = p
		}
		if err := weightPath(p); err != nil {
			d.addAt(t.at("weights"), fmt.Sprintf("element %d: %v", i, err))
		}
	}
}

// weightPath checks that p is a readable regular file or directory.
func weightPath(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, errors.Unwrap(err))
	}
	if !fi.Mode().IsRegular() && !fi.IsDir() {
		return fmt.Errorf("%s is not a regular file or a directory (%s)", p, fi.Mode().Type())
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("%s cannot be read: %w", p, errors.Unwrap(err))
	}
	return f.Close()
}
