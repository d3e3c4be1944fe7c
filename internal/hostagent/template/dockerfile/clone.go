package dockerfile

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// CloneFile copies the file src to dst (created or truncated): a reflink
// (FICLONE) where the file system can, else a copy of src's data regions
// only (SEEK_DATA/SEEK_HOLE), so that a sparse disk image stays sparse.
// It is Config.Clone's default.
func CloneFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("clone to %s: %w", dst, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("clone to %s: %w", dst, cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	if err := sparseCopy(in, out); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return out.Sync()
}

// sparseCopy copies in's data regions to the same offsets of out and sets
// out's size, leaving holes as holes.
func sparseCopy(in, out *os.File) error {
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
