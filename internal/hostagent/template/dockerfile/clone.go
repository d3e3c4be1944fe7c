package dockerfile

import (
	"fmt"
	"os"

	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
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
	if err := volume.CopySparse(in, out); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return out.Sync()
}
