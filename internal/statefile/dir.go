package statefile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUnsafeDir is wrapped by the errors of Dir and CheckDir.
var ErrUnsafeDir = errors.New("another user owns or may write it: chown it to napd's user and chmod go-w")

// Dir makes sure path is a directory napd alone controls, creating it (and
// its missing parents, 0755) with mode perm when absent. napd runs as root
// and writes here, so the directory must be owned by napd's user and
// writable by nobody else, and every directory above it owned by root or
// napd's user and writable by nobody else unless sticky (/tmp): otherwise a
// local user could swap it or plant files in it. A symlink on the way must
// be root's or napd's user's. The error names the path, its owner and its
// mode.
func Dir(path string, perm fs.FileMode) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		parent := filepath.Dir(filepath.Clean(path))
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return err
		}
		// Nothing is created inside a directory another user controls.
		if err := checkAbove(path, parent); err != nil {
			return err
		}
		// Mkdir of the leaf alone: it fails on anything planted meanwhile.
		if err := os.Mkdir(path, perm); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return CheckDir(path)
}

// CheckDir reports whether path is a directory napd alone controls (see
// Dir), without creating anything.
func CheckDir(path string) error {
	path = filepath.Clean(path)
	// Symlinks on the path as written: only root's or napd's own.
	for p := path; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if uid := owner(fi); !trusted(uid) {
				return fmt.Errorf("%s: a symlink owned by uid %d: %w", p, uid, ErrUnsafeDir)
			}
		}
		if p == filepath.Dir(p) {
			break
		}
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s: not a directory but %s", path, kind(fi.Mode()))
	}
	if uid := owner(fi); uid != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s: owner uid %d, mode %s: %w", path, uid, fi.Mode().Perm(), ErrUnsafeDir)
	}
	return checkAbove(path, filepath.Dir(real))
}

// CheckCreatable reports whether Dir(path) could succeed without creating
// anything: path itself when it exists, else the nearest directory above it
// that does (for `napd --check`).
func CheckCreatable(path string) error {
	path = filepath.Clean(path)
	if _, err := os.Lstat(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return CheckDir(path)
	}
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			return checkAbove(path, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// checkAbove checks dir and every directory above it: owned by root or
// napd's user, writable by nobody else unless sticky. path is for messages.
func checkAbove(path, dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	for p := real; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		uid := owner(fi)
		if !trusted(uid) || (fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0) {
			return fmt.Errorf("%s: its parent %s has owner uid %d, mode %s: %w", path, p, uid, fi.Mode(), ErrUnsafeDir)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func owner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

func trusted(uid int) bool { return uid == 0 || uid == os.Geteuid() }

// OpenAppend opens path for appending, creating it with mode perm. It
// follows no symlink (a planted one is an error, its target untouched),
// opens nothing but a regular file, and sets the mode on the open file.
func OpenAppend(path string, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s: a symlink: %w", path, ErrUnsafe)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s: %s: %w", path, fi.Mode().Type(), ErrUnsafe)
	}
	if err == nil {
		err = f.Chmod(perm)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ReadRegular reads a file an operator points napd at (the config, the
// API keys): a regular file of at most limit bytes. A device, a FIFO or a
// directory is an error, never a read that blocks or does not end.
func ReadRegular(path string, limit int64) ([]byte, error) {
	return readRegular(path, limit, nil)
}

// ReadTrusted is ReadRegular for a file whose content napd acts on as
// root and which sits among others (a configuration drop-in): it must also
// pass CheckTrusted.
func ReadTrusted(path string, limit int64) ([]byte, error) {
	return readRegular(path, limit, CheckTrusted)
}

// ReadPrivate is ReadRegular for a file holding a secret napd sends
// elsewhere (a remote model's api_key_file): others than its owner and
// group must have no access to it.
func ReadPrivate(path string, limit int64) ([]byte, error) {
	return readRegular(path, limit, checkPrivate)
}

func checkPrivate(path string, fi fs.FileInfo) error {
	if fi.Mode().Perm()&0o007 != 0 {
		return fmt.Errorf("%s: mode %s lets every user read it: make it 0600 or 0640 (group napd)", path, fi.Mode().Perm())
	}
	return nil
}

// CheckTrusted reports a file or directory (fi, from a stat of path) that
// a user other than root and napd's own owns, or that group or others may
// write: what is in it could then be planted.
func CheckTrusted(path string, fi fs.FileInfo) error {
	if uid := owner(fi); !trusted(uid) || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s: owner uid %d, mode %s: %w", path, uid, fi.Mode().Perm(), ErrUnsafeDir)
	}
	return nil
}

func readRegular(path string, limit int64, check func(string, fs.FileInfo) error) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file but %s", path, kind(fi.Mode()))
	}
	if check != nil {
		if err := check(path, fi); err != nil {
			return nil, err
		}
	}
	return readAtMost(f, path, fi.Size(), limit)
}

// kind names a file type for an error message.
func kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "a special file"
}
