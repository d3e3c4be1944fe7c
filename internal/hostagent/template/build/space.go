package build

import "github.com/pandastack/pandastack/internal/contract/builds"

// DiskSpace returns a Config.CheckSpace for the file system of dir (the
// template store's): a build needs min bytes free there.
func DiskSpace(dir string, min int64) func() error {
	return func() error { return builds.CheckFree(dir, min, 0) }
}
