package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/agent/config/llamaswap"
	"github.com/napd/napd/internal/statefile"
)

const importSynopsis = "import llama-swap FILE [--out DIR] [--keys FILE]"

// importCmd converts another proxy's configuration to napd's: the TOML on
// standard output (or one drop-in per model in --out DIR), the summary
// on standard error.
func (c *cli) importCmd(args []string) error {
	if len(args) == 0 || args[0] != "llama-swap" {
		return usageError{"import: want '" + importSynopsis + "'"}
	}
	var out, keys string
	rest, err := c.subFlags("import llama-swap", importSynopsis, args[1:], func(fs *flag.FlagSet) {
		fs.StringVar(&out, "out", "", "write one drop-in per model into `DIR` (e.g. /etc/napd/napd.d); the main file's part goes to standard output")
		fs.StringVar(&keys, "keys", "", "write the apiKeys to `FILE` (napd's api_keys_file, mode 0600); needed when the config has apiKeys")
	})
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usageError{"import llama-swap: want exactly one FILE"}
	}
	src := rest[0]
	data, err := statefile.ReadRegular(src, config.MaxFileSize)
	if err != nil {
		return err
	}
	if keys != "" {
		if keys, err = filepath.Abs(keys); err != nil {
			return err
		}
	}
	res, err := llamaswap.Convert(data, llamaswap.Options{File: src, KeysFile: keys})
	if err != nil {
		return err
	}
	// Nothing is overwritten: every file is checked before one is written.
	var files []string
	if out != "" {
		for _, m := range res.Models {
			if m.Converted {
				files = append(files, filepath.Join(out, m.Name+".toml"))
			}
		}
	}
	if res.Keys != "" {
		files = append(files, keys)
	}
	for _, f := range files {
		if _, err := os.Lstat(f); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s exists: napctl import overwrites nothing", f)
		}
	}
	if res.Keys != "" {
		if err := writeNew(keys, res.Keys, 0o600); err != nil {
			return err
		}
	}
	if out == "" {
		fmt.Fprint(c.out, res.Main())
	} else {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		fmt.Fprint(c.out, res.Host)
		fmt.Fprintf(c.out, "\n# The models are in %s, one drop-in each; merge the tables above into the main file.\n", out)
		for _, m := range res.Models {
			if !m.Converted {
				fmt.Fprintf(c.out, "\n%s", m.TOML)
				continue
			}
			head := fmt.Sprintf("# llama-swap's model %q, converted from %s by napctl import llama-swap.\n", m.ID, src)
			if err := writeNew(filepath.Join(out, m.Name+".toml"), head+m.TOML, 0o644); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(c.errOut, "napctl import llama-swap: converted %s:\n", src)
	for _, l := range res.Converted {
		fmt.Fprintf(c.errOut, "  %s\n", l)
	}
	if len(res.Dropped) > 0 {
		fmt.Fprintln(c.errOut, "not converted (each is a comment in the output, where it was):")
		for _, l := range res.Dropped {
			fmt.Fprintf(c.errOut, "  %s\n", l)
		}
	}
	fmt.Fprintln(c.errOut, "Check the result with napd --check (docs/migrating.md).")
	return nil
}

// writeNew creates path with content; an existing file is an error.
func writeNew(path, content string, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
