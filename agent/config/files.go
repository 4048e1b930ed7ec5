package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/napd/napd/internal/statefile"
)

// DefaultIncludeDir is agent.include_dir's default: napd.d beside the
// main file (/etc/napd/napd.d).
const DefaultIncludeDir = "napd.d"

// Limits of a configuration directory: far above a real one, they keep a
// directory filled by mistake (or by a runaway script) from making every
// reload read gigabytes.
const (
	MaxDropIns     = 256
	MaxDropInBytes = 16 << 20 // all drop-ins together
)

// Load reads and validates the configuration file at path, a regular file
// of at most MaxFileSize bytes, and the drop-ins of its include_dir.
func Load(path string) (*Config, error) {
	data, err := statefile.ReadRegular(path, MaxFileSize)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	d := newDecoder()
	d.readMain(path, data)
	d.readDropIns()
	return d.finish()
}

// DropInDir is the directory whose drop-ins Load reads: agent.include_dir,
// relative to the main file's directory; "" when include_dir is "".
func (c *Config) DropInDir() string {
	dir := c.Agent.IncludeDir
	if dir == "" || filepath.IsAbs(dir) {
		return dir
	}
	return filepath.Join(filepath.Dir(c.Path), dir)
}

// dropIn reports whether a directory entry's name is read as a drop-in:
// *.toml, not a dotfile. Editor backups (name~, .#name) and dpkg's copies
// (name.dpkg-old, name.dpkg-new, name.dpkg-dist) are skipped so.
func dropIn(name string) bool {
	return strings.HasSuffix(name, ".toml") && !strings.HasPrefix(name, ".")
}

// readDropIns reads the include directory's drop-ins in lexical order. A
// missing directory is no drop-ins when include_dir is the default (a
// main file away from /etc/napd has none), an error otherwise; the
// directory and each file must be owned by root or napd's user and
// writable by nobody else (napd runs their commands).
func (d *decoder) readDropIns() {
	cfg := d.cfg
	dir := cfg.DropInDir()
	if dir == "" {
		return
	}
	at := entry{file: cfg.Path, path: toml.Key{"agent", "include_dir"}}
	if t := d.tables["agent"]; t != nil {
		at = t.at("include_dir")
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist) && cfg.Agent.IncludeDir == DefaultIncludeDir:
		return
	case err != nil:
		d.addAt(at, err.Error())
		return
	case !fi.IsDir():
		d.addAt(at, dir+": not a directory")
		return
	}
	if err := statefile.CheckTrusted(dir, fi); err != nil {
		d.addAt(at, err.Error())
		return
	}
	ents, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		d.addAt(at, err.Error())
		return
	}
	var paths []string
	var total int64
	for _, e := range ents {
		if !dropIn(e.Name()) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if fi, err := os.Stat(p); err == nil {
			total += fi.Size()
		}
		paths = append(paths, p)
	}
	switch {
	case len(paths) > MaxDropIns:
		d.addAt(at, fmt.Sprintf("%s: %d drop-ins, more than %d", dir, len(paths), MaxDropIns))
		return
	case total > MaxDropInBytes:
		d.addAt(at, fmt.Sprintf("%s: the drop-ins hold %d bytes together, more than %d MiB", dir, total, MaxDropInBytes>>20))
		return
	}
	for _, p := range paths {
		d.order[p] = len(d.order)
		data, err := statefile.ReadTrusted(p, MaxFileSize)
		if err != nil {
			d.errs = append(d.errs, Problem{File: p, Message: err.Error()})
			continue
		}
		cfg.DropIns = append(cfg.DropIns, p)
		d.readDropIn(p, data)
	}
}
