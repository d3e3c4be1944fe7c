package build

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// MinFreeBytes is the free space a disk keeps for everything else: builds
// (DiskSpace) and the build contexts the API receives are refused below it.
const MinFreeBytes = 1 << 30

// DiskSpace returns a Config.CheckSpace for the file system of dir (the
// template store's): a build needs min bytes free there.
func DiskSpace(dir string, min int64) func() error {
	return func() error { return CheckFree(dir, min, 0) }
}

// CheckFree fails with an error wrapping ErrNoSpace when the file system
// of dir has less than min+need bytes free. Its message, for users, names
// no path. An unreadable file system is not refused here: writing to it
// says more.
func CheckFree(dir string, min, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil
	}
	free := int64(st.Bavail) * st.Bsize
	if free < min+need {
		what := ""
		if need > 0 {
			what = fmt.Sprintf(" besides the %d MiB of this build's context", need>>20)
		}
		return fmt.Errorf("%w: the server has %d MiB of disk free for template builds and keeps %d MiB free%s; retry once builds or templates were deleted",
			ErrNoSpace, free>>20, min>>20, what)
	}
	return nil
}
