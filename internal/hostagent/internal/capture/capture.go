// Package capture is a saved machine as it lies on a host's disk: the
// files of a capture (a snapshot's, a fork's, a paused sandbox's), how
// they are checked, and Info, the description a snapshot carries in its
// directory (snapshot.json), as its set's metadata in the object store
// and in the header of its packs. It is the one type that the host agent
// and the packages that move captures between hosts (storesync through
// the object store, transfer straight from host to host) share, so that
// none of them needs the others' to read what it receives.
package capture

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// The files of a capture, in its directory.
const (
	DiskFile  = "rootfs.ext4"
	MemFile   = "vm.mem"
	StateFile = "vm.state"
	// MetaFile is a snapshot's description (Info) inside its directory.
	MetaFile = "snapshot.json"
)

// Info is a snapshot as a host records it (snapshot.json, and the header
// of its packs): the contract's description (host.SnapshotInfo) with the
// whole machine spec a restore needs, which shadows the contract's Shape
// under the same JSON name.
type Info struct {
	host.SnapshotInfo
	Spec vmm.Spec `json:"spec"`
}

// Contract is si as the control plane sees it.
func (si Info) Contract() host.SnapshotInfo {
	c := si.SnapshotInfo
	c.Spec = host.Shape{MemoryMiB: si.Spec.MemoryMiB, VCPUs: si.Spec.VCPUs}
	return c
}

// Verify checks a sealed capture directory; a directory sealed by no one
// (made before checksums existed) passes if its files exist. The memory
// image of a lazy restore (IsLazy) is checked by size only: its content
// comes checked chunk by chunk.
func Verify(dir string) error {
	if IsLazy(dir) {
		return verifyExcept(dir, MemFile)
	}
	err := manifest.Verify(dir)
	if errors.Is(err, manifest.ErrNoManifest) {
		for _, f := range []string{MemFile, StateFile, DiskFile} {
			if _, serr := os.Stat(filepath.Join(dir, f)); serr != nil {
				return fmt.Errorf("%w: %s is missing", manifest.ErrCorrupt, f)
			}
		}
		return nil
	}
	return err
}

// CheckDownloaded checks a capture just downloaded from the object store
// or received in a pack (its directory dir). The download checked every
// chunk against its hash as it came (fetched, made from a patch, or
// copied from a seed) or reflinked it from a template whose files passed
// their checksums and whose index was made from them: reading all of it
// again against the capture's checksums would find nothing new. So this
// checks that the files are there with their sizes; a set older than
// checksums has no manifest and is checked as Verify does.
func CheckDownloaded(dir string) error {
	err := manifest.Check(dir)
	if errors.Is(err, manifest.ErrNoManifest) {
		return Verify(dir)
	}
	return err
}

// IsLazy reports whether dir's memory image is a lazy one (a symbolic
// link to the host's lazymem mount, which only lazy restores make).
func IsLazy(dir string) bool {
	fi, err := os.Lstat(filepath.Join(dir, MemFile))
	return err == nil && fi.Mode()&os.ModeSymlink != 0
}

// verifyExcept is manifest.Verify of dir but for file skip, whose size
// only is checked (its content comes checked chunk by chunk).
func verifyExcept(dir, skip string) error {
	if err := manifest.Check(dir); err != nil {
		return err
	}
	m, err := manifest.Read(dir)
	if errors.Is(err, manifest.ErrNoManifest) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, f := range m.Files {
		if f.Name == skip {
			continue
		}
		got, err := manifest.Sum(filepath.Join(dir, f.Name))
		if err != nil {
			return fmt.Errorf("%w: %s: %v", manifest.ErrCorrupt, f.Name, err)
		}
		if got.Sum != f.Sum {
			return fmt.Errorf("%w: %s does not match its checksum", manifest.ErrCorrupt, f.Name)
		}
	}
	return nil
}
