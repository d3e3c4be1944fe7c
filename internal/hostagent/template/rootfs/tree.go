package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// tree is the directory a root filesystem is flattened into. Every path a
// layer names is resolved by the kernel inside the tree (openat2 with
// RESOLVE_IN_ROOT): ".." stops at the tree's root and symlinks, absolute or
// not, resolve as if the tree were "/", the way they will in the guest. Only
// the last component of a name is created or replaced, relative to its
// resolved parent, and never followed. Names whose ".." would climb out are
// refused outright: no sane image has them.
//
// Entries keep the owner, mode (setuid, setgid and sticky bits too), mtime
// and extended attributes (PAX SCHILY.xattr.* records) their header gives;
// a directory holding the tree that cannot store those attributes is an
// error. Device nodes are made as the header says, or skipped without
// CAP_MKNOD (the guest's devtmpfs has the usual ones); fifos are made.
type tree struct {
	dir  string // the tree's root, a 0755 directory FromImage made
	root int    // O_PATH descriptor of dir

	// limit caps the bytes of regular files written (0: none); written
	// counts them.
	limit, written int64

	// dirTimes holds every directory's times, set at the end: each entry
	// written into a directory changes its mtime.
	dirTimes map[string]time.Time
	// made holds the names the current layer made: its own whiteouts do not
	// apply to them (they hide lower layers' files only).
	made map[string]bool
}

func newTree(dir string, limit int64) (*tree, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the temporary tree: %w", err)
	}
	return &tree{dir: dir, root: fd, limit: limit, dirTimes: map[string]time.Time{}}, nil
}

func (t *tree) close() {
	if t.root >= 0 {
		unix.Close(t.root)
		t.root = -1
	}
}

// invalid is the error for a layer entry that cannot be applied safely.
func invalid(format string, args ...any) error {
	return errorf(ErrInvalid, nil, format, args...)
}

// cleanName turns a tar entry's name into a path relative to the tree's
// root ("" is the root itself). Absolute names are taken relative to the
// root; names that climb out of it with ".." are refused.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", invalid("entry name %q has a NUL byte", name)
	}
	rel := path.Clean(strings.TrimLeft(name, "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", invalid("entry %q points outside the root filesystem", name)
	}
	if rel == "." {
		return "", nil
	}
	return rel, nil
}

// resolve opens name (relative to the root; "" is the root), following
// symlinks inside the tree, with flags (O_PATH or O_RDONLY, plus
// O_DIRECTORY if it must be one).
func (t *tree) resolve(name string, flags int) (int, error) {
	if name == "" {
		name = "."
	}
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for {
		fd, err := unix.Openat2(t.root, name, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// parent opens the directory that holds name and returns it with name's
// last component. Missing parents are made (0755, root-owned), as Docker
// does for layers that do not list them.
func (t *tree) parent(name string) (int, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	fd, err := t.resolve(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err == unix.ENOENT {
		if err := t.mkdirAll(dir); err != nil {
			return -1, "", err
		}
		fd, err = t.resolve(dir, unix.O_PATH|unix.O_DIRECTORY)
	}
	if err == unix.ENOTDIR {
		return -1, "", invalid("cannot write %s: a parent is not a directory", name)
	}
	if err != nil {
		return -1, "", fmt.Errorf("open the directory of %s: %w", name, err)
	}
	return fd, base, nil
}

func (t *tree) mkdirAll(dir string) error {
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fd, err := t.resolve(p, unix.O_PATH|unix.O_DIRECTORY)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if err != unix.ENOENT {
			return fmt.Errorf("open directory %s: %w", p, err)
		}
		pfd, err := t.resolve(strings.Join(parts[:i], "/"), unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("open the directory of %s: %w", p, err)
		}
		err = unix.Mkdirat(pfd, parts[i], 0o755)
		if err == nil { // 0755 whatever the umask (panda up runs with 077)
			err = unix.Fchmodat(pfd, parts[i], 0o755, 0)
		}
		unix.Close(pfd)
		if err == unix.EEXIST {
			return invalid("cannot make directory %s: a dangling symlink is in the way", p)
		}
		if err != nil {
			return fmt.Errorf("make directory %s: %w", p, err)
		}
		t.made[p] = true
	}
	return nil
}

// applyLayer applies one layer's uncompressed tar stream.
func (t *tree) applyLayer(ctx context.Context, r io.Reader) error {
	t.made = map[string]bool{}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the layer: %w", err)
		}
		if err := t.entry(hdr, tr); err != nil {
			return err
		}
	}
}

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// entry applies one tar entry.
func (t *tree) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	base := path.Base(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return t.whiteout(name)
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink,
		tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
	default:
		return nil // global headers, and kinds no root filesystem needs
	}
	if name == "" {
		return t.setRoot(hdr)
	}

	pfd, base, err := t.parent(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := t.makeRoom(pfd, base, name, hdr); err != nil {
		return err
	}
	t.made[name] = true

	switch hdr.Typeflag {
	case tar.TypeDir:
		return t.makeDir(pfd, base, name, hdr)
	case tar.TypeReg, tar.TypeGNUSparse: // the reader fills a sparse file's holes
		return t.makeFile(pfd, base, name, hdr, r)
	case tar.TypeSymlink:
		return t.makeSymlink(pfd, base, name, hdr)
	case tar.TypeLink:
		return t.makeHardLink(pfd, base, name, hdr)
	default: // tar.TypeChar, tar.TypeBlock, tar.TypeFifo
		return t.makeNode(pfd, base, name, hdr)
	}
}

// setRoot applies the entry of the root itself ("./"): its owner, mode and
// times only; it must be a directory.
func (t *tree) setRoot(hdr *tar.Header) error {
	if hdr.Typeflag != tar.TypeDir {
		return invalid("entry %q replaces the root with a non-directory", hdr.Name)
	}
	fd, err := t.resolve("", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("open the root: %w", err)
	}
	defer unix.Close(fd)
	t.dirTimes[""] = hdr.ModTime
	return t.setMeta(fd, -1, "", hdr)
}

// makeRoom removes what is at base in directory pfd (name in the tree)
// before hdr's entry takes its place, unless both are directories: a
// directory entry then only sets the existing one's metadata.
func (t *tree) makeRoom(pfd int, base, name string, hdr *tar.Header) error {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == unix.ENOENT:
	case err != nil:
		return fmt.Errorf("stat %s: %w", name, err)
	case hdr.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR:
	default:
		if err := removeAt(pfd, base); err != nil {
			return fmt.Errorf("replace %s: %w", name, err)
		}
	}
	return nil
}

// makeDir makes directory base in pfd (or keeps the one there) and sets
// its owner and mode; its times are set last (finish), after everything
// that goes into it.
func (t *tree) makeDir(pfd int, base, name string, hdr *tar.Header) error {
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil && err != unix.EEXIST {
		return fmt.Errorf("make directory %s: %w", name, err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", name, err)
	}
	defer unix.Close(fd)
	t.dirTimes[name] = hdr.ModTime
	return t.setMeta(fd, -1, "", hdr)
}

// makeFile creates regular file base in pfd with the contents r holds
// (within the tree's byte limit), and its owner, mode and times.
func (t *tree) makeFile(pfd int, base, name string, hdr *tar.Header, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := t.copy(f, r, name); err != nil {
		return err
	}
	if err := t.setMeta(fd, -1, "", hdr); err != nil {
		return err
	}
	return t.setTimes(pfd, base, name, hdr.ModTime)
}

// makeSymlink makes symlink base in pfd to hdr's (non-empty) target, with its
// owner and times.
func (t *tree) makeSymlink(pfd int, base, name string, hdr *tar.Header) error {
	if strings.IndexByte(hdr.Linkname, 0) >= 0 || hdr.Linkname == "" {
		return invalid("symlink %s has a bad target %q", name, hdr.Linkname)
	}
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return fmt.Errorf("make symlink %s: %w", name, err)
	}
	if err := t.setMeta(-1, pfd, base, hdr); err != nil {
		return err
	}
	return t.setTimes(pfd, base, name, hdr.ModTime)
}

// makeHardLink links base in pfd to hdr's target, which must be in the tree
// already (a link to a symlink links the symlink). The inode keeps its
// own owner, mode and times.
func (t *tree) makeHardLink(pfd int, base, name string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return err
	}
	if target == "" {
		return invalid("hard link %s points at the root", name)
	}
	tdir, tbase := path.Split(target)
	tpfd, err := t.resolve(strings.TrimSuffix(tdir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return invalid("hard link %s points at %s, which the image does not have", name, hdr.Linkname)
	}
	if err != nil {
		return fmt.Errorf("open the directory of %s: %w", hdr.Linkname, err)
	}
	defer unix.Close(tpfd)
	// Without AT_SYMLINK_FOLLOW a link to a symlink links the symlink.
	if err := unix.Linkat(tpfd, tbase, pfd, base, 0); err != nil {
		if err == unix.ENOENT {
			return invalid("hard link %s points at %s, which the image does not have", name, hdr.Linkname)
		}
		return fmt.Errorf("make hard link %s to %s: %w", name, hdr.Linkname, err)
	}
	return nil
}

// makeNode makes device node or FIFO base in pfd, with its owner, mode and
// times. Without CAP_MKNOD (in a container) a device node is left out.
func (t *tree) makeNode(pfd int, base, name string, hdr *tar.Header) error {
	mode := uint32(unix.S_IFIFO)
	switch hdr.Typeflag {
	case tar.TypeChar:
		mode = unix.S_IFCHR
	case tar.TypeBlock:
		mode = unix.S_IFBLK
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	err := unix.Mknodat(pfd, base, mode|0o600, int(dev))
	if err == unix.EPERM && mode != unix.S_IFIFO {
		// No CAP_MKNOD (a container): images rarely need their own
		// device nodes, the guest's devtmpfs has them.
		delete(t.made, name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("make device node %s: %w", name, err)
	}
	if err := t.setMeta(-1, pfd, base, hdr); err != nil {
		return err
	}
	return t.setTimes(pfd, base, name, hdr.ModTime)
}

// copy writes a regular file's contents, within the tree's byte limit.
func (t *tree) copy(f *os.File, r io.Reader, name string) error {
	if t.limit > 0 {
		r = io.LimitReader(r, t.limit-t.written+1)
	}
	n, err := io.Copy(f, r)
	t.written += n
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if t.limit > 0 && t.written > t.limit {
		return errorf(ErrTooLarge, nil, "its files hold more than the limit of %s", mib(t.limit))
	}
	return nil
}

// setMeta sets the owner, mode and extended attributes the header gives,
// on fd if it is not -1, else on base in the directory pfd (not followed).
// The owner goes first: chown clears setuid bits and file capabilities.
func (t *tree) setMeta(fd, pfd int, base string, hdr *tar.Header) error {
	perm := uint32(hdr.Mode) & 0o7777
	var err error
	if fd >= 0 {
		err = unix.Fchown(fd, hdr.Uid, hdr.Gid)
	} else {
		err = unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("set the owner of %s: %w", hdr.Name, err)
	}
	switch {
	case hdr.Typeflag == tar.TypeSymlink: // a symlink's mode means nothing
	case fd >= 0:
		err = unix.Fchmod(fd, perm)
	default:
		// Not a symlink (made just now, by this goroutine), so nothing is
		// followed.
		err = unix.Fchmodat(pfd, base, perm, 0)
	}
	if err != nil {
		return fmt.Errorf("set the mode of %s: %w", hdr.Name, err)
	}
	for key, value := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(key, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if fd >= 0 {
			err = unix.Fsetxattr(fd, attr, []byte(value), 0)
		} else {
			// The parent through its descriptor; the last component is not
			// followed.
			err = unix.Lsetxattr(fmt.Sprintf("/proc/self/fd/%d/%s", pfd, base), attr, []byte(value), 0)
		}
		if err != nil {
			return fmt.Errorf("set extended attribute %s of %s: %w", attr, hdr.Name, err)
		}
	}
	return nil
}

func (t *tree) setTimes(pfd int, base, name string, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set the times of %s: %w", name, err)
	}
	return nil
}

// whiteout applies a whiteout entry: ".wh..wh..opq" empties its directory
// of what lower layers put there, ".wh.NAME" removes NAME.
func (t *tree) whiteout(name string) error {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if base == opaqueMarker {
		fd, err := t.resolve(dir, unix.O_RDONLY|unix.O_DIRECTORY)
		if err == unix.ENOENT || err == unix.ENOTDIR {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open %s for its opaque whiteout: %w", dir, err)
		}
		f := os.NewFile(uintptr(fd), dir)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return fmt.Errorf("list %s for its opaque whiteout: %w", dir, err)
		}
		for _, n := range names {
			if t.made[path.Join(dir, n)] {
				continue
			}
			if err := removeAt(fd, n); err != nil {
				return fmt.Errorf("opaque whiteout of %s: %w", dir, err)
			}
		}
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return invalid("bad whiteout entry %q", name)
	}
	if t.made[path.Join(dir, target)] {
		return nil
	}
	fd, err := t.resolve(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open the directory of whiteout %s: %w", name, err)
	}
	defer unix.Close(fd)
	if err := removeAt(fd, target); err != nil {
		return fmt.Errorf("whiteout %s: %w", name, err)
	}
	return nil
}

// removeAt removes name in the directory dirfd, a directory with all it
// holds; symlinks are removed, never followed. Missing is fine.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
	if err == unix.ENOENT {
		return nil
	}
	return err
}

// finish adds what every guest needs and the image may lack (/run, /tmp,
// /work, /etc/hosts; what the image has is kept as it is), then sets the
// directories' times.
func (t *tree) finish() error {
	t.made = map[string]bool{}
	for _, d := range []struct {
		name string
		perm uint32
	}{{"run", 0o755}, {"tmp", 0o1777}, {"work", 0o755}} {
		if err := t.ensure(d.name, d.perm, nil); err != nil {
			return err
		}
	}
	if err := t.ensure("etc/hosts", 0o644, []byte("127.0.0.1 localhost\n")); err != nil {
		return err
	}
	for name, mtime := range t.dirTimes {
		if err := t.dirTime(name, mtime); err != nil {
			return err
		}
	}
	return nil
}

// ensure makes name, a directory (content nil) or a file, root-owned with
// perm, unless something is there already.
func (t *tree) ensure(name string, perm uint32, content []byte) error {
	pfd, base, err := t.parent(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil {
		return nil
	}
	if err != unix.ENOENT {
		return fmt.Errorf("stat /%s: %w", name, err)
	}
	if content == nil {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fmt.Errorf("make /%s: %w", name, err)
		}
		return unix.Fchmodat(pfd, base, perm, 0)
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("make /%s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if _, err := f.Write(content); err != nil {
		return fmt.Errorf("write /%s: %w", name, err)
	}
	return unix.Fchmod(fd, perm)
}

func (t *tree) dirTime(name string, mtime time.Time) error {
	if name == "" {
		ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
		return unix.UtimesNanoAt(unix.AT_FDCWD, t.dir, ts, 0)
	}
	dir, base := path.Split(name)
	fd, err := t.resolve(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil // whited out since
	}
	if err != nil {
		return fmt.Errorf("open the directory of %s: %w", name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil // gone, or replaced by a non-directory
	}
	return t.setTimes(fd, base, name, mtime)
}
