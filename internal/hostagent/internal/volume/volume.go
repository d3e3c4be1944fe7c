// Package volume owns the directory where PandaStack keeps sandbox disks,
// memory images and snapshots. Everything there must be cloneable with
// reflinks (FICLONE), so that a sandbox's disk costs only its metadata until
// it writes. When the data directory's file system cannot reflink (ext4, the
// usual root file system), Open creates an XFS image with reflink enabled,
// loop-mounts it inside the data directory and Close unmounts it again.
package volume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNoReflink means the file system does not support reflink clones.
var ErrNoReflink = errors.New("file system cannot reflink")

// Options configures Open.
type Options struct {
	// ImageSize is the size of the sparse XFS image created when the data
	// directory cannot reflink. Zero picks min(100 GiB, half the free space).
	ImageSize int64
	// AdoptMount makes an image found already mounted (left by a crashed
	// run) count as mounted by us, so Close unmounts it. Only the process
	// that owns the data directory (the server holding its lock) may set it.
	AdoptMount bool
	Logger     *slog.Logger
}

// Volume is an open store directory.
type Volume struct {
	// Dir is the reflink-capable directory.
	Dir string
	// Image is the XFS image backing Dir, or "" when Dir is a plain
	// directory on a reflink-capable file system.
	Image string

	mounted bool // we mounted Image on Dir and must unmount it
	log     *slog.Logger
}

// Open returns the store under dataDir (dataDir/store), mounting an XFS
// image there if dataDir cannot reflink.
func Open(ctx context.Context, dataDir string, opts Options) (*Volume, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("open volume: %w", err)
	}
	store := filepath.Join(dataDir, "store")
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, fmt.Errorf("open volume: %w", err)
	}
	v := &Volume{Dir: store, log: log}
	if mounted, err := isMountPoint(store); err != nil {
		return nil, fmt.Errorf("open volume: %w", err)
	} else if mounted {
		// Left mounted by an earlier run (crash, or sandboxes kept running).
		if err := CheckReflink(store); err != nil {
			return nil, fmt.Errorf("open volume: %s is mounted but %w", store, err)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "store.xfs")); err == nil {
			v.Image = filepath.Join(dataDir, "store.xfs")
			v.mounted = opts.AdoptMount
		}
		setSmallCoW(store)
		return v, nil
	}
	if err := CheckReflink(store); err == nil {
		setSmallCoW(store)
		return v, nil
	}
	v.Image = filepath.Join(dataDir, "store.xfs")
	if err := v.mountImage(ctx, opts.ImageSize); err != nil {
		return nil, fmt.Errorf("open volume: %s cannot reflink and %w; put the data directory on XFS (mkfs.xfs -m reflink=1) or btrfs", dataDir, err)
	}
	if err := CheckReflink(store); err != nil {
		v.Close()
		return nil, fmt.Errorf("open volume: mounted %s but %w", v.Image, err)
	}
	setSmallCoW(store)
	return v, nil
}

func (v *Volume) mountImage(ctx context.Context, size int64) error {
	if os.Geteuid() != 0 {
		return errors.New("creating a loop-mounted XFS image needs root")
	}
	if _, err := os.Stat(v.Image); errors.Is(err, os.ErrNotExist) {
		if size <= 0 {
			var st unix.Statfs_t
			if err := unix.Statfs(filepath.Dir(v.Image), &st); err != nil {
				return fmt.Errorf("statfs: %w", err)
			}
			size = min(100<<30, int64(st.Bavail)*st.Bsize/2)
		}
		if size < 1<<30 {
			return fmt.Errorf("only %d MiB free for the XFS image (need at least 1 GiB)", size>>20)
		}
		v.log.Info("creating xfs image for reflink clones", "image", v.Image, "size_gib", size>>30)
		tmp := v.Image + ".new"
		if err := os.WriteFile(tmp, nil, 0o600); err != nil {
			return fmt.Errorf("create image: %w", err)
		}
		if err := os.Truncate(tmp, size); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("size image: %w", err)
		}
		if out, err := exec.CommandContext(ctx, "mkfs.xfs", "-q", "-m", "reflink=1", tmp).CombinedOutput(); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("mkfs.xfs (install xfsprogs: make setup): %v: %s", err, strings.TrimSpace(string(out)))
		}
		if err := os.Rename(tmp, v.Image); err != nil {
			return fmt.Errorf("create image: %w", err)
		}
	}
	if out, err := exec.CommandContext(ctx, "mount", "-t", "xfs", "-o", "loop,noatime", v.Image, v.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mount %s: %v: %s", v.Image, err, strings.TrimSpace(string(out)))
	}
	v.mounted = true
	v.log.Info("mounted xfs image", "image", v.Image, "dir", v.Dir)
	return nil
}

// Close unmounts the image if Open mounted it. It fails (and leaves the
// mount) while files on it are still open, e.g. by running VMMs.
// Idempotent.
func (v *Volume) Close() error {
	if !v.mounted {
		return nil
	}
	if out, err := exec.Command("umount", v.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("unmount %s: %v: %s", v.Dir, err, strings.TrimSpace(string(out)))
	}
	v.mounted = false
	return nil
}

// Clone makes dst a reflink copy of src (O(metadata), copy-on-write). dst
// must not exist. On error dst is removed.
func Clone(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		out.Close()
		os.Remove(dst)
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			return fmt.Errorf("clone %s: %w", src, ErrNoReflink)
		}
		return fmt.Errorf("clone %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		os.Remove(dst)
		return fmt.Errorf("clone: %w", err)
	}
	return nil
}

// CloneOpen makes out, an empty file open for writing, a copy of in: a
// reflink (FICLONE) where the file system can, else a copy of in's data
// regions only (CopySparse). out is not synced.
func CloneOpen(out, in *os.File) error {
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	return CopySparse(in, out)
}

// CopySparse copies in's data regions to the same offsets of out and sets
// out's size, leaving holes as holes (SEEK_DATA/SEEK_HOLE; everything
// where the file system cannot say).
func CopySparse(in, out *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	fd := int(in.Fd())
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			// No SEEK_DATA here: copy everything.
			data = off
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyBuffer(out, io.LimitReader(in, hole-data), buf); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// CheckReflink returns nil if files in dir can be reflink-cloned.
func CheckReflink(dir string) error {
	f, err := os.CreateTemp(dir, ".reflink-probe-*")
	if err != nil {
		return fmt.Errorf("probe reflink: %w", err)
	}
	name := f.Name()
	defer os.Remove(name)
	_, err = f.Write(make([]byte, 4096))
	f.Close()
	if err != nil {
		return fmt.Errorf("probe reflink: %w", err)
	}
	dst := name + ".clone"
	defer os.Remove(dst)
	return Clone(name, dst)
}

func isMountPoint(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == dir {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMount undoes the octal escapes of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// fsxattr is struct fsxattr of <linux/fs.h>.
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	Pad        [8]byte
}

const (
	fsIocFsgetxattr   = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr   = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagCowextsize = 0x00010000
)

// setSmallCoW sets a 4 KiB copy-on-write extent size hint on dir and the
// directories below it; files and directories created in them inherit it.
// XFS's default hint (32 blocks) makes every 4 KiB page written into a
// reflinked memory image allocate 128 KiB, which turned a fork that
// dirtied 1.5 MiB into ~13 MiB of disk. Not every file system has the
// hint (btrfs); their errors are ignored.
func setSmallCoW(dir string) {
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		var x fsxattr
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFsgetxattr, uintptr(unsafe.Pointer(&x))); e != 0 {
			return filepath.SkipAll
		}
		x.Xflags |= fsXflagCowextsize
		x.Cowextsize = 4096
		unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFssetxattr, uintptr(unsafe.Pointer(&x)))
		return nil
	})
}
