package pgcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A mirror is a copy of a tree of binaries in the temporary directory,
// readable by everyone, made as root for the server's user, who cannot
// reach the tree (mirrorTree). It is named after the tree's base name and
// its stamp (the tree's path, and its postgres's size and modification
// time), so that clusters of one tree share it and a tree fetched again
// gets a new one.
//
// Its users coordinate with flock(2) on a lock file next to it (<mirror>.lock,
// outside the mirror): each user holds a shared lock from before it checks
// the mirror until its cluster stops, and the mirror is made and removed
// only under the exclusive lock. A user that stops then tries the exclusive
// lock without waiting: it gets it only when no one else holds the shared
// one, and then removes the mirror and the lock file (the mirror first: a
// process that opened the lock file before it was removed sees, once it
// has its lock, that the path no longer names that file, and starts over).
// A user that dies is counted out by the kernel; the mirror it leaves is
// removed by the next last user, or, when its tree changed, when the next
// mirror of that tree's name is made.
const (
	mirrorPrefix    = "watermill-outbox-postgres-"
	mirrorStampFile = ".watermill-outbox-mirror"
)

// mirrorSuffix is how a mirror's name ends after its tree's base name: a
// dash and twelve hex digits of its stamp's sha256.
var mirrorSuffix = regexp.MustCompile(`^-[0-9a-f]{12}$`)

// errForeign says that a file in the way of a mirror or of its lock is not
// this user's (or not what it should be): this process then copies the tree
// for itself alone.
var errForeign = errors.New("pgcluster: the temporary directory holds a file of someone else where the mirror goes")

// treeStamp is what a mirror of tree records, to tell whether it was made
// from the tree as it is.
func treeStamp(tree string) (string, error) {
	st, err := os.Stat(filepath.Join(tree, "bin", "postgres"))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s\n%d %d\n", tree, st.Size(), st.ModTime().UnixNano()), nil
}

func mirrorName(tree, stamp string) string {
	sum := sha256.Sum256([]byte(stamp))
	return filepath.Join(os.TempDir(), mirrorPrefix+filepath.Base(tree)+"-"+hex.EncodeToString(sum[:6]))
}

// mirrorTree returns a mirror of tree and its release, which the caller
// calls when it no longer runs the mirror's binaries: the last user's
// release removes it. A mirror made before is reused when it is ours
// (owned by this user, writable by no one else) and was made from the same
// tree as it is now. When someone else's file is in the way, the copy is
// this caller's alone, and its release removes it. ctx bounds the waits for
// the lock (another process making the mirror).
func mirrorTree(ctx context.Context, tree string) (string, func(), error) {
	stamp, err := treeStamp(tree)
	if err != nil {
		return "", nil, err
	}
	name := mirrorName(tree, stamp)
	lockPath := name + ".lock"
	contended := 0
	for {
		f, err := openLock(lockPath)
		if errors.Is(err, errForeign) {
			return privateMirror(tree, stamp)
		}
		if err != nil {
			return "", nil, err
		}
		if err := flockWait(ctx, f, syscall.LOCK_SH); err != nil {
			_ = f.Close()
			return "", nil, err
		}
		if !sameFile(f, lockPath) { // removed by the last user while we waited
			_ = f.Close()
			continue
		}
		if trustedMirror(name, stamp) {
			return name, releaseMirror(f, name, lockPath), nil
		}
		// Make it, alone. Taking the exclusive lock gives up the shared one
		// first (flock(2)): whoever gets it next decides, so check again.
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				return "", nil, fmt.Errorf("pgcluster: lock %s: %w", lockPath, err)
			}
			// Another process holds the shared lock: it is making the
			// mirror too, or runs a mirror that was damaged under it.
			if contended++; contended == 20 {
				return privateMirror(tree, stamp)
			}
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return "", nil, err
			}
			continue
		}
		if !sameFile(f, lockPath) {
			_ = f.Close()
			continue
		}
		if !trustedMirror(name, stamp) {
			err := makeMirror(tree, stamp, name)
			if errors.Is(err, errForeign) {
				_ = f.Close()
				return privateMirror(tree, stamp)
			}
			if err != nil {
				_ = f.Close()
				return "", nil, err
			}
			removeStaleMirrors(tree, name)
		}
		// Keep only the shared lock; someone may take the exclusive one in
		// between (a last user of before, removing it): check again.
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
			_ = f.Close()
			return "", nil, fmt.Errorf("pgcluster: lock %s: %w", lockPath, err)
		}
		if sameFile(f, lockPath) && trustedMirror(name, stamp) {
			return name, releaseMirror(f, name, lockPath), nil
		}
		_ = f.Close()
	}
}

// releaseMirror returns the release of a mirror whose lock file f is held
// shared: it removes the mirror when no one else holds it.
func releaseMirror(f *os.File, name, lockPath string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			defer f.Close()
			// Conversion to exclusive: without waiting, and only when no
			// one else holds the lock (our shared lock is given up either way).
			if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil || !sameFile(f, lockPath) {
				return
			}
			if ownDir(name) {
				_ = os.RemoveAll(name)
			}
			_ = os.Remove(lockPath)
		})
	}
}

// makeMirror copies tree to name (under the mirror's exclusive lock): into
// a new directory first, renamed into place with its stamp, so that a
// mirror is always complete. A broken mirror of ours in the way is removed
// first.
func makeMirror(tree, stamp, name string) error {
	if _, err := os.Lstat(name); err == nil {
		if !ownDir(name) {
			return errForeign
		}
		if err := os.RemoveAll(name); err != nil {
			return err
		}
	}
	tmp, err := copyForMirror(tree, stamp)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	return nil
}

// privateMirror copies tree for this caller alone; its release removes it.
func privateMirror(tree, stamp string) (string, func(), error) {
	dir, err := copyForMirror(tree, stamp)
	if err != nil {
		return "", nil, err
	}
	var once sync.Once
	return dir, func() { once.Do(func() { _ = os.RemoveAll(dir) }) }, nil
}

// copyForMirror copies tree into a new directory of the temporary
// directory, with stamp, readable by everyone.
func copyForMirror(tree, stamp string) (string, error) {
	tmp, err := os.MkdirTemp(os.TempDir(), "."+mirrorPrefix)
	if err != nil {
		return "", err
	}
	err = copyTree(tree, tmp)
	if err == nil {
		err = os.WriteFile(filepath.Join(tmp, mirrorStampFile), []byte(stamp), 0o644)
	}
	if err == nil {
		err = os.Chmod(tmp, 0o755)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	return tmp, nil
}

// removeStaleMirrors removes the mirrors named after tree's base name, other
// than keep, that were made from a tree that is no longer as it was (fetched
// again, or removed) and that no one uses (their exclusive lock is free).
// Mirrors of other trees of the same base name, as they are, stay.
func removeStaleMirrors(tree, keep string) {
	prefix := filepath.Join(os.TempDir(), mirrorPrefix+filepath.Base(tree))
	names, _ := filepath.Glob(globEscape(prefix) + "-*")
	for _, name := range names {
		if name == keep || !mirrorSuffix.MatchString(strings.TrimPrefix(name, prefix)) || !ownDir(name) {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(name, mirrorStampFile)); err == nil {
			made, _, _ := strings.Cut(string(b), "\n")
			if now, err := treeStamp(made); err == nil && now == string(b) {
				continue // the mirror of another tree, as it is
			}
		}
		lockPath := name + ".lock"
		f, err := openLock(lockPath)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil && sameFile(f, lockPath) {
			_ = os.RemoveAll(name)
			_ = os.Remove(lockPath)
		}
		_ = f.Close()
	}
}

// globEscape quotes the characters filepath.Match gives a meaning to.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// trustedMirror reports whether dir is a complete mirror of ours made with
// stamp.
func trustedMirror(dir, stamp string) bool {
	if !ownDir(dir) {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, mirrorStampFile))
	return err == nil && string(b) == stamp
}

// ownDir reports whether dir is a directory (not a link to one) of this
// user that no one else may write to.
func ownDir(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return false
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(sys.Uid) == os.Geteuid()
}

// openLock opens (creating it) the lock file path, which must be a regular
// file of this user's: errForeign otherwise.
func openLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) || errors.Is(err, fs.ErrPermission) {
			return nil, fmt.Errorf("%w: %v", errForeign, err)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || !ok || int(sys.Uid) != os.Geteuid() {
		_ = f.Close()
		return nil, fmt.Errorf("%w: %s", errForeign, path)
	}
	return f, nil
}

// sameFile reports whether path still names the open file f.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Lstat(path)
	return err == nil && os.SameFile(a, b)
}

// flockWait takes the lock how on f, waiting as long as ctx allows.
func flockWait(ctx context.Context, f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("pgcluster: lock %s: %w", f.Name(), err)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("pgcluster: waiting for the lock %s (another process copying the binaries): %w", f.Name(), err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// copyTree copies the directories, regular files and symbolic links of src
// into dst (which exists), readable by everyone, keeping the execute bits.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil || rel == "." {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.Mkdir(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			return copyFile(path, target, fi.Mode().Perm()|0o444)
		}
		return nil
	})
}

func copyFile(src, dst string, mode fs.FileMode) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	_, err = io.Copy(out, in)
	if err == nil {
		err = os.Chmod(dst, mode) // the umask took bits off
	}
	return err
}
