package rootfs

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

const (
	blockSize = 4096
	inodeSize = 256 // mke2fs's default for ext4
	// bytesPerInode is mke2fs's default inode ratio for ext4.
	bytesPerInode = 16384
)

// usage is what a tree takes in an ext4 file system.
type usage struct {
	data   int64 // bytes of data blocks: files, directories, long symlinks
	inodes int64
}

// measure walks the tree as mke2fs -d will copy it.
func measure(dir string) (usage, error) {
	var u usage
	seen := map[uint64]bool{} // inodes with several links, counted once
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		u.data += int64(8 + (len(d.Name())+3)&^3) // its entry in the parent
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat %s: no inode", p)
		}
		if !d.IsDir() && st.Nlink > 1 {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		u.inodes++
		switch {
		case info.Mode().IsRegular():
			u.data += roundUp(info.Size(), blockSize)
			u.data += info.Size() / (128 << 20) * blockSize // extent tree blocks
		case d.IsDir():
			u.data += blockSize
		case info.Mode()&fs.ModeSymlink != 0 && info.Size() >= 60:
			u.data += blockSize // longer targets do not fit in the inode
		}
		return nil
	})
	if err != nil {
		return usage{}, fmt.Errorf("measure the tree: %w", err)
	}
	return u, nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// inodeCount is the number of inodes to give a file system of size bytes
// holding u: mke2fs's default, or more for trees of many small files, with
// room for what sandboxes create.
func inodeCount(u usage, size int64) int64 {
	return max(size/bytesPerInode, u.inodes+u.inodes/2+1024)
}

// journalSize is mke2fs's default journal size for a file system of size
// bytes (ext2fs_default_journal_size).
func journalSize(size int64) int64 {
	blocks := size / blockSize
	var j int64
	switch {
	case blocks < 2048:
		j = 0
	case blocks < 32768:
		j = 1024
	case blocks < 256*1024:
		j = 4096
	case blocks < 512*1024:
		j = 8192
	case blocks < 4096*1024:
		j = 16384
	case blocks < 8192*1024:
		j = 32768
	case blocks < 16384*1024:
		j = 65536
	case blocks < 32768*1024:
		j = 131072
	default:
		j = 262144
	}
	return j * blockSize
}

// overhead is what ext4 itself takes of a file system of size bytes with
// inodes inodes: inode tables, the journal, and about 2% for bitmaps, group
// descriptors and the blocks reserved for growing, plus a margin.
func overhead(size, inodes int64) int64 {
	return inodes*inodeSize + journalSize(size) + size/50 + 4<<20
}

// needed is the smallest size, in whole MiB, that holds u.
func needed(u usage) int64 {
	size := u.data
	for range 8 { // the overhead grows with the size; this settles fast
		size = u.data + overhead(size, inodeCount(u, size))
	}
	return roundUp(size, 1<<20) >> 20
}

// sizeFor chooses the file system's size in MiB: opts.SizeMiB if set, else
// what the tree needs plus headroom (half as much again, at least 256 MiB,
// in steps of 64 MiB), capped by opts.MaxSizeMiB.
func sizeFor(u usage, opts Options) (int64, error) {
	need := needed(u)
	if opts.SizeMiB > 0 {
		if need > int64(opts.SizeMiB) {
			return 0, errorf(ErrTooLarge, nil, "its files need about %d MiB, more than the size of %d MiB asked for", need, opts.SizeMiB)
		}
		return int64(opts.SizeMiB), nil
	}
	if limit := int64(opts.MaxSizeMiB); limit > 0 && need > limit {
		return 0, errorf(ErrTooLarge, nil, "its files need about %d MiB, more than the limit of %d MiB", need, limit)
	}
	size := roundUp(need+max(need/2, 256), 64)
	if limit := int64(opts.MaxSizeMiB); limit > 0 {
		size = min(size, limit)
	}
	return size, nil
}

// makeExt4 makes the ext4 image of the tree dir at out: in a temporary file
// next to it, renamed over it once complete and synced.
func makeExt4(ctx context.Context, dir, out, label string, opts Options, progress func(string)) (err error) {
	u, err := measure(dir)
	if err != nil {
		return err
	}
	sizeMiB, err := sizeFor(u, opts)
	if err != nil {
		return err
	}
	mkfs, err := findMkfs()
	if err != nil {
		return err
	}

	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return fmt.Errorf("make the image file: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	err = f.Truncate(sizeMiB << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("make the image file: %w", err)
	}

	progress(fmt.Sprintf("making ext4 (%d MiB)", sizeMiB))
	// 4 KiB blocks and 256-byte inodes whatever the size (mke2fs picks 1 KiB
	// blocks for small file systems): what measure and needed count in.
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-L", label, "-b", "4096", "-I", "256",
		"-N", fmt.Sprint(inodeCount(u, sizeMiB<<20)),
		"-E", "lazy_itable_init=1,lazy_journal_init=1",
		"-d", dir, tmp)
	if msg, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		text := strings.TrimSpace(string(msg))
		if strings.Contains(text, "Could not allocate") || strings.Contains(text, "No space left") {
			return errorf(ErrTooLarge, err, "its files do not fit in %d MiB", sizeMiB)
		}
		return fmt.Errorf("mkfs.ext4: %w: %s", err, text)
	}

	if err := copyRoot(ctx, dir, tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil { // CreateTemp's 0600
		return fmt.Errorf("make the image file: %w", err)
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("put the image in place: %w", err)
	}
	if err := syncFile(filepath.Dir(out)); err != nil {
		return err
	}
	return nil
}

// copyRoot gives the file system's root directory the tree root's owner and
// mode, which mke2fs -d does not copy (it makes it 0755 root's), when they
// differ from that: an image may say what its root is.
func copyRoot(ctx context.Context, dir, img string) error {
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat the tree: %w", err)
	}
	st := info.Sys().(*syscall.Stat_t)
	if st.Mode&0o7777 == 0o755 && st.Uid == 0 && st.Gid == 0 {
		return nil
	}
	debugfs, err := findTool("debugfs")
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, debugfs, "-w", "-f", "-", img)
	cmd.Stdin = strings.NewReader(fmt.Sprintf("sif / mode 0%o\nsif / uid %d\nsif / gid %d\n", st.Mode, st.Uid, st.Gid))
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("set the root's owner and mode: debugfs: %w: %s", err, strings.TrimSpace(string(msg)))
	}
	return nil
}

func findMkfs() (string, error) { return findTool("mkfs.ext4") }

// findTool finds one of e2fsprogs' programs, in PATH or in sbin (which a
// user's PATH may lack).
func findTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/" + name, "/sbin/" + name} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: install e2fsprogs (1.43 or later, for mkfs -d)", name)
}

func syncFile(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("sync %s: %w", name, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", name, err)
	}
	return nil
}
