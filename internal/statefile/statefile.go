// Package statefile writes and reads napd's small files under state_dir
// (learned footprints, remembered ports, engine process groups). napd runs
// as root and acts on what these files say, so a file is written atomically
// (a crash leaves the old or the new content, never a torn one) and read
// only when it is a regular file, not a symlink, owned by napd's user and
// writable by nobody else.
package statefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Write replaces path with data, mode perm. The temporary file is created
// exclusively (no symlink is followed) and its mode set on the open file.
func Write(path string, data []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	err = tmp.Chmod(perm)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// The rename is durable only once the directory is synced.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// ErrUnsafe is returned by Read for a file napd must not trust.
var ErrUnsafe = errors.New("not a regular file owned by napd's user and writable only by it")

// Read returns the content of path, at most limit bytes. A missing file is
// an fs.ErrNotExist error; a symlink, a non-regular file, a file owned by
// another user or writable by group or others is ErrUnsafe; a larger file
// is an error.
func Read(path string, limit int64) ([]byte, error) {
	// O_NONBLOCK: a FIFO planted at path must not block the open.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: a symlink: %w", path, ErrUnsafe)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s: %s: %w", path, fi.Mode().Type(), ErrUnsafe)
	case !ok || int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("%s: owner uid %d: %w", path, st.Uid, ErrUnsafe)
	case fi.Mode().Perm()&0o022 != 0:
		return nil, fmt.Errorf("%s: mode %s: %w", path, fi.Mode().Perm(), ErrUnsafe)
	}
	return readAtMost(f, path, fi.Size(), limit)
}

// readAtMost reads the open file f of the given size, refusing more than
// limit bytes (before reading, and again while reading a growing file).
func readAtMost(f *os.File, path string, size, limit int64) ([]byte, error) {
	if size > limit {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", path, size, limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: more than %d bytes", path, limit)
	}
	return data, nil
}
