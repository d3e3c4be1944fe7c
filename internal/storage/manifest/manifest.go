// Package manifest makes a directory of files durable and checkable: Seal
// flushes the files to stable storage, records each one's size and content
// hash in manifest.json (written to a temporary name, flushed and renamed)
// and flushes the directory, so that after any crash the directory is
// either complete or recognisably incomplete; Verify recomputes the hashes
// and reports a mismatch as ErrCorrupt. It also owns the small durable-file
// helpers the host agent uses (WriteFile, Rename, SyncDir).
//
// The content hash is made for large sparse files (guest memory images,
// disk images of gigabytes that hold far less data): the file is cut into
// 1 MiB blocks, each block is hashed with xxHash64, and the file's hash is
// xxHash64 of the block hashes. A block that lies entirely in a hole (no
// data according to SEEK_DATA) is not read: its hash is that of 1 MiB of
// zeros, which it reads as. So the hash depends only on the file's
// content, not on how it is laid out on disk, and costs what the file
// holds, not its size. It detects corruption (torn writes, bit rot, a
// truncated copy); it is not a defence against someone who can write the
// files on purpose.
package manifest

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// Name is the manifest's file name inside a sealed directory.
const Name = "manifest.json"

// Errors.
var (
	// ErrCorrupt: a file is missing, has another size or another content
	// than the manifest says, or the manifest itself is unreadable.
	ErrCorrupt = errs.New(errs.Corrupt, "corrupt")
	// ErrNoManifest: the directory was never sealed.
	ErrNoManifest = errors.New("no manifest")
)

// File is one file of a manifest.
type File struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	// Sum is the content hash: "xxh64b1m:" and 16 hex digits.
	Sum string `json:"sum"`
}

// Manifest lists the files of a sealed directory.
type Manifest struct {
	Version int    `json:"version"`
	Files   []File `json:"files"`
}

const (
	version   = 1
	blockSize = 1 << 20
	sumPrefix = "xxh64b1m:"
)

var zeroBlock = sync.OnceValue(func() uint64 { return xxhash.Sum64(make([]byte, blockSize)) })

// Sum hashes the file at path (see the package doc).
func Sum(path string) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return File{}, err
	}
	size := st.Size()
	n := int((size + blockSize - 1) / blockSize)
	sums := make([]uint64, n)
	// Blocks are hashed by a few workers; each reads its own blocks with
	// pread, so the order of reads does not matter.
	workers := min(runtime.GOMAXPROCS(0), 4, max(n, 1))
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, blockSize)
			for i := w; i < n; i += workers {
				off := int64(i) * blockSize
				end := min(off+blockSize, size)
				if end-off == blockSize && hole(f, off, end) {
					sums[i] = zeroBlock()
					continue
				}
				b := buf[:end-off]
				if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
					errs[w] = err
					return
				}
				sums[i] = xxhash.Sum64(b)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return File{}, fmt.Errorf("hash %s: %w", filepath.Base(path), err)
	}
	d := xxhash.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(size))
	d.Write(b[:])
	for _, s := range sums {
		binary.BigEndian.PutUint64(b[:], s)
		d.Write(b[:])
	}
	binary.BigEndian.PutUint64(b[:], d.Sum64())
	return File{Name: filepath.Base(path), Size: size, Sum: sumPrefix + hex.EncodeToString(b[:])}, nil
}

// hole reports whether [off, end) holds no data. Errors count as data: the
// block is then read.
func hole(f *os.File, off, end int64) bool {
	next, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return true // no data from off to the end of the file
	}
	return err == nil && next >= end
}

// Seal flushes the named files of dir and dir itself to stable storage and
// writes the manifest of their sizes and hashes, durably. Files not named
// are not part of the manifest. Sealing a sealed directory replaces its
// manifest.
func Seal(dir string, names ...string) (Manifest, error) {
	m := Manifest{Version: version, Files: make([]File, len(names))}
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := filepath.Join(dir, name)
			if err := syncFile(p); err != nil {
				errs[i] = err
				return
			}
			m.Files[i], errs[i] = Sum(p)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Manifest{}, fmt.Errorf("seal %s: %w", filepath.Base(dir), err)
	}
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, err
	}
	if err := WriteFile(filepath.Join(dir, Name), b, 0o600); err != nil {
		return Manifest{}, fmt.Errorf("seal %s: %w", filepath.Base(dir), err)
	}
	return m, nil
}

// Read returns dir's manifest: ErrNoManifest if it has none, ErrCorrupt if
// it cannot be decoded or names something other than a file of dir (a
// manifest may come from another host or the object store with the files
// it lists: it never makes Check, Verify or Fingerprint look outside dir).
func Read(dir string) (Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, Name))
	if errors.Is(err, os.ErrNotExist) {
		return Manifest{}, ErrNoManifest
	}
	if err != nil {
		return Manifest{}, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil || m.Version != version {
		return Manifest{}, fmt.Errorf("%w: unreadable manifest", ErrCorrupt)
	}
	for _, f := range m.Files {
		if f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, "/\x00") || f.Size < 0 {
			return Manifest{}, fmt.Errorf("%w: the manifest lists %q of %d bytes", ErrCorrupt, f.Name, f.Size)
		}
	}
	return m, nil
}

// Check is Verify without hashing: every file of the manifest exists with
// its size. It is what recovery uses to tell a complete directory from one
// a crash interrupted.
func Check(dir string) error {
	m, err := Read(dir)
	if err != nil {
		return err
	}
	for _, f := range m.Files {
		st, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil {
			return fmt.Errorf("%w: %s is missing", ErrCorrupt, f.Name)
		}
		if st.Size() != f.Size {
			return fmt.Errorf("%w: %s has %d bytes, the manifest says %d", ErrCorrupt, f.Name, st.Size(), f.Size)
		}
	}
	return nil
}

// Verify checks every file of dir's manifest against its size and hash.
// The error names the first file that does not match (ErrCorrupt), or is
// ErrNoManifest.
func Verify(dir string) error {
	if err := Check(dir); err != nil {
		return err
	}
	m, _ := Read(dir)
	for _, f := range m.Files {
		got, err := Sum(filepath.Join(dir, f.Name))
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, f.Name, err)
		}
		if got.Sum != f.Sum {
			return fmt.Errorf("%w: %s does not match its checksum", ErrCorrupt, f.Name)
		}
	}
	return nil
}

// Fingerprint identifies the current version of a sealed directory's files
// without reading them: the inode, size and modification time of the
// manifest and of every file it lists. A write to any of them changes it,
// so a directory verified with one fingerprint needs no new Verify while
// its fingerprint stays the same. (Not the change time: hard links, which
// every restore makes, and ownership changes set it. What a fingerprint
// cannot see is a disk corrupting data behind the file system's back, or
// someone resetting times on purpose; only Verify sees those.)
func Fingerprint(dir string) (string, error) {
	m, err := Read(dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, name := range append([]string{Name}, fileNames(m)...) {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, name), &st); err != nil {
			return "", fmt.Errorf("%w: %s is missing", ErrCorrupt, name)
		}
		fmt.Fprintf(&b, "%s:%d:%d:%d.%d;", name, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec)
	}
	return b.String(), nil
}

func fileNames(m Manifest) []string {
	out := make([]string, len(m.Files))
	for i, f := range m.Files {
		out[i] = f.Name
	}
	return out
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// SyncDir flushes a directory's entries (creations, renames, removals).
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// WriteFile writes data to path durably: to a temporary name in the same
// directory, flushed, renamed over path, and the directory flushed. A
// crash leaves either the old file or the new one, never a mix.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// Rename renames oldpath to newpath and flushes the directories involved.
func Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(newpath)); err != nil {
		return err
	}
	if d := filepath.Dir(oldpath); d != filepath.Dir(newpath) {
		return SyncDir(d)
	}
	return nil
}
