package guest

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Owner is who the entries of an extracted archive belong to.
type Owner struct{ UID, GID int }

// ArchiveOwner gives each entry the owner the archive records (ADD of a
// tar archive); the directories Extract makes for them are root's.
var ArchiveOwner = Owner{UID: -1, GID: -1}

// ids is who owns the entry hdr: the archive's owner or o.
func (o Owner) ids(hdr *tar.Header) (int, int) {
	if o.UID < 0 {
		return hdr.Uid, hdr.Gid
	}
	return o.UID, o.GID
}

// dirIDs is who owns a directory Extract makes on its own.
func (o Owner) dirIDs() (int, int) {
	if o.UID < 0 {
		return 0, 0
	}
	return o.UID, o.GID
}

// ResolveOwner resolves a Docker USER spec ("name", "uid", "name:group",
// "uid:gid") in root's etc/passwd and etc/group, as execs do. "" is 0:0.
func ResolveOwner(root, spec string) (Owner, error) {
	if spec == "" {
		return ArchiveOwner, nil
	}
	u, err := resolveUser(root, spec)
	if err != nil {
		return Owner{}, err
	}
	return Owner{UID: int(u.uid), GID: int(u.gid)}, nil
}

// Extract unpacks the tar stream r into the directory root, every entry
// (and every parent directory it creates, mode 0755) owned by owner (or,
// with ArchiveOwner, each entry by the owner the tar records and the
// directories made for them by root), with the entry's mode bits (setuid,
// setgid and sticky included) and mtime. It handles directories, regular
// files, symbolic links, hard links, FIFOs and device nodes.
//
// The archive cannot write outside root: an entry name or hard link
// target that is absolute or has a ".." component is refused (the
// extraction stops with an error), and every path is resolved with
// openat2(RESOLVE_IN_ROOT), so a symbolic link in root's tree (one
// already there or one the archive made) resolves as if root were "/":
// writing through it stays inside root. An existing entry of another
// kind is replaced; an existing directory is kept as it is (its owner,
// mode and times: the archive holds the parents of what COPY copies, and
// /etc or /tmp must not become the copied files' owner's or 0755).
func Extract(root string, r io.Reader, owner Owner) error {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	x := &extractor{root: rootFD, owner: owner}
	tr := tar.NewReader(r)
	type dirTime struct {
		name string
		hdr  *tar.Header
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "" {
			// "./" or "/": the root itself.
			if hdr.Typeflag == tar.TypeDir {
				dirs = append(dirs, dirTime{"", hdr})
			}
			continue
		}
		if err := x.entry(name, hdr, tr); err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{name, hdr})
		}
	}
	// Directory mtimes last, deepest first: adding entries changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if d.name == "" {
			continue // the root's own metadata is not the archive's to set
		}
		if err := x.setTimes(d.name, d.hdr); err != nil {
			return fmt.Errorf("extract %s: %w", d.name, err)
		}
	}
	return nil
}

// entryName checks a tar entry name (or hard link target) and returns it
// cleaned and relative ("" for the root). Absolute names and names with
// a ".." component are refused.
func entryName(raw string) (string, error) {
	if raw == "" || strings.ContainsRune(raw, 0) {
		return "", fmt.Errorf("refusing archive entry %q: empty or with a NUL byte", raw)
	}
	if strings.HasPrefix(raw, "/") {
		return "", fmt.Errorf("refusing archive entry %q: absolute path", raw)
	}
	for _, c := range strings.Split(raw, "/") {
		if c == ".." {
			return "", fmt.Errorf("refusing archive entry %q: it leaves the root (..)", raw)
		}
	}
	name := path.Clean(raw)
	if name == "." {
		return "", nil
	}
	return name, nil
}

type extractor struct {
	root  int
	owner Owner
}

// openIn opens rel (relative, may be "" for root) inside root, resolving
// every symbolic link as if root were "/".
func (x *extractor) openIn(rel string, flags uint64) (int, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(x.root, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	for err == unix.EAGAIN || err == unix.EINTR { // a concurrent rename; try again
		fd, err = unix.Openat2(x.root, rel, &unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: "/" + rel, Err: err}
	}
	return fd, nil
}

// parent returns a descriptor of the directory that holds name (creating
// missing directories, mode 0755, owned by owner) and name's last
// component.
func (x *extractor) parent(name string) (int, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	fd, err := x.mkdirAll(dir)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// mkdirAll returns an O_PATH descriptor of directory rel, making it and
// its missing parents.
func (x *extractor) mkdirAll(rel string) (int, error) {
	fd, err := x.openIn(rel, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil || rel == "" || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	dir, base := path.Split(rel)
	pfd, err := x.mkdirAll(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, &os.PathError{Op: "mkdir", Path: "/" + rel, Err: err}
	} else if err == nil {
		uid, gid := x.owner.dirIDs()
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return -1, &os.PathError{Op: "chown", Path: "/" + rel, Err: err}
		}
	}
	return x.openIn(rel, unix.O_PATH|unix.O_DIRECTORY)
}

func (x *extractor) entry(name string, hdr *tar.Header, r io.Reader) error {
	pfd, base, err := x.parent(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				// A symbolic link to a directory (lib -> usr/lib) stays,
				// as Docker's COPY keeps it: the entries go through it.
				if fd, err := x.openIn(name, unix.O_PATH|unix.O_DIRECTORY); err == nil {
					unix.Close(fd)
					return nil
				}
			}
			if err := unix.Unlinkat(pfd, base, 0); err != nil {
				return err
			}
		}
		if err := unix.Mkdirat(pfd, base, 0o700); errors.Is(err, unix.EEXIST) {
			return nil // an existing directory stays as it is
		} else if err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return x.ownFD(fd, mode, hdr)
	case tar.TypeReg, tar.TypeRegA:
		if err := x.clear(pfd, base); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			return err
		}
		if err := x.ownFD(fd, mode, hdr); err != nil {
			return err
		}
		return x.setTimesAt(pfd, base, hdr)
	case tar.TypeSymlink:
		if err := x.clear(pfd, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return err
		}
		uid, gid := x.owner.ids(hdr)
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return x.setTimesAt(pfd, base, hdr)
	case tar.TypeLink:
		target, err := entryName(hdr.Linkname)
		if err != nil {
			return err
		}
		if target == "" {
			return fmt.Errorf("refusing a hard link to the root")
		}
		tdir, tbase := path.Split(target)
		tfd, err := x.openIn(strings.TrimSuffix(tdir, "/"), unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("hard link target: %w", err)
		}
		defer unix.Close(tfd)
		if err := x.clear(pfd, base); err != nil {
			return err
		}
		// Flags 0: a symbolic link target is linked itself, not followed.
		return unix.Linkat(tfd, tbase, pfd, base, 0)
	case tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
		if err := x.clear(pfd, base); err != nil {
			return err
		}
		kind := map[byte]uint32{tar.TypeFifo: unix.S_IFIFO, tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK}[hdr.Typeflag]
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(pfd, base, kind|0o600, int(dev)); err != nil {
			return err
		}
		uid, gid := x.owner.ids(hdr)
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		// Not a symbolic link, so following is harmless; opening a FIFO
		// or device to fchmod it would not be.
		if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
			return err
		}
		return x.setTimesAt(pfd, base, hdr)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("unsupported archive entry type %q", hdr.Typeflag)
	}
}

// clear removes whatever is at base in pfd (a file, a link, an empty
// directory), so that a new entry can be made there; a non-empty
// directory is an error.
func (x *extractor) clear(pfd int, base string) error {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	flags := 0
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(pfd, base, flags); err != nil {
		return fmt.Errorf("replace existing entry: %w", err)
	}
	return nil
}

// ownFD gives an open file or directory to owner, then sets its mode
// (after the chown, which clears setuid and setgid bits).
func (x *extractor) ownFD(fd int, mode uint32, hdr *tar.Header) error {
	uid, gid := x.owner.ids(hdr)
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

func (x *extractor) setTimesAt(pfd int, base string, hdr *tar.Header) error {
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if !hdr.AccessTime.IsZero() {
		ts[0] = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func (x *extractor) setTimes(name string, hdr *tar.Header) error {
	dir, base := path.Split(name)
	pfd, err := x.openIn(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return x.setTimesAt(pfd, base, hdr)
}
