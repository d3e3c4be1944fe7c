// Package volumes owns a host's volumes: directory trees that outlive
// sandboxes, kept under the host agent's data directory (the Store), and
// served to the guests that mount them over the guest channel (Serve).
// Every access to a volume's files goes through an os.Root on its data
// directory: no path, ".." or symlink reaches outside it.
package volumes

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"golang.org/x/sys/unix"
)

// Block is the unit of a volume's accounting: a regular file counts its
// size rounded up to it, a directory or symlink one of it.
const Block = 4096

// The files of a volume's directory.
const (
	metaFile = "meta.json"
	dataDir  = "data"
	trashDir = ".trash" // volumes being deleted, emptied on Open
)

// ValidID reports whether id is a volume id: "vol_" and 16 lowercase
// letters or digits.
func ValidID(id string) bool {
	rest, ok := strings.CutPrefix(id, "vol_")
	if !ok || len(rest) != 16 {
		return false
	}
	for _, c := range rest {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// meta is a volume's meta.json.
type meta struct {
	LimitBytes int64     `json:"limit_bytes"`
	CreatedAt  time.Time `json:"created_at"`
	// Parent is the volume it was branched from ("" for none).
	Parent string `json:"parent,omitempty"`
}

// Store is the volumes of one host agent, in one directory: a directory
// per volume holding meta.json and data/, its tree. Safe for concurrent
// use. A volume's accountant (Space) and its os.Root are made on its
// first use and shared by every user until the volume is deleted or
// promoted over.
type Store struct {
	dir string

	mu   sync.Mutex // guards open; held across structural changes (create, delete, branch, promote, resize)
	open map[string]*openVol
}

// openVol is an open volume: its root and its accountant.
type openVol struct {
	id   string
	root *os.Root
	sp   *space
}

// Open opens the store in dir (created if missing) and removes what
// interrupted work left (half-made volumes, deletions).
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, trashDir), 0o700); err != nil {
		return nil, fmt.Errorf("open volume store: %w", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	trash, _ := os.ReadDir(filepath.Join(dir, trashDir))
	for _, e := range trash {
		os.RemoveAll(filepath.Join(dir, trashDir, e.Name()))
	}
	return &Store{dir: dir, open: map[string]*openVol{}}, nil
}

// Close closes the volumes' roots: whoever serves one from its root sees
// its operations fail; a later use of the Store opens them again.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, h := range s.open {
		h.root.Close()
		delete(s.open, id)
	}
	return nil
}

func (s *Store) volDir(id string) string { return filepath.Join(s.dir, id) }

func checkID(id string) error {
	if !ValidID(id) {
		return fmt.Errorf("%w: volume id %q is not vol_ and 16 lowercase letters or digits", host.ErrInvalid, id)
	}
	return nil
}

func readMeta(dir string) (meta, error) {
	var m meta
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%s: %w", filepath.Join(dir, metaFile), err)
	}
	return m, nil
}

func writeMeta(dir string, m meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return manifest.WriteFile(filepath.Join(dir, metaFile), b, 0o600)
}

// ioError classifies a failure of the host's own file system.
func ioError(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %v", host.ErrNoSpace, err)
	}
	return err
}

// Create makes the empty volume id with a limit of limitBytes.
func (s *Store) Create(id string, limitBytes int64) (host.VolumeInfo, error) {
	if err := checkID(id); err != nil {
		return host.VolumeInfo{}, err
	}
	if limitBytes <= 0 {
		return host.VolumeInfo{}, fmt.Errorf("%w: volume limit %d must be positive", host.ErrInvalid, limitBytes)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := meta{LimitBytes: limitBytes, CreatedAt: time.Now().UTC()}
	if err := s.install(id, m, func(tmp string) error { return os.Mkdir(filepath.Join(tmp, dataDir), 0o755) }); err != nil {
		return host.VolumeInfo{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	return host.VolumeInfo{ID: id, LimitBytes: limitBytes, CreatedAt: m.CreatedAt}, nil
}

// install makes volume id whole or not at all: fill makes its data in a
// temporary directory, which gets m and is then renamed into place.
// Called with s.mu held.
func (s *Store) install(id string, m meta, fill func(tmp string) error) error {
	if _, err := os.Lstat(s.volDir(id)); err == nil {
		return fmt.Errorf("%w: volume %s exists", host.ErrConflict, id)
	}
	tmp := s.volDir(id) + ".tmp-" + randHex(4)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return ioError(err)
	}
	err := fill(tmp)
	if err == nil {
		err = writeMeta(tmp, m)
	}
	if err == nil {
		err = os.Rename(tmp, s.volDir(id))
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return ioError(err)
	}
	return nil
}

// get returns volume id's handle, opening it (and counting its bytes) on
// first use. Called with s.mu held.
func (s *Store) getLocked(id string) (*openVol, meta, error) {
	if err := checkID(id); err != nil {
		return nil, meta{}, err
	}
	m, err := readMeta(s.volDir(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, m, fmt.Errorf("volume %s: %w", id, host.ErrNotFound)
	}
	if err != nil {
		return nil, m, fmt.Errorf("volume %s: %w", id, err)
	}
	if h := s.open[id]; h != nil {
		return h, m, nil
	}
	root, err := os.OpenRoot(filepath.Join(s.volDir(id), dataDir))
	if err != nil {
		return nil, m, fmt.Errorf("open volume %s: %w", id, err)
	}
	used, err := walkUsed(root)
	if err != nil {
		root.Close()
		return nil, m, fmt.Errorf("count volume %s: %w", id, err)
	}
	h := &openVol{id: id, root: root, sp: &space{used: used, limit: m.LimitBytes}}
	s.open[id] = h
	return h, m, nil
}

// handle returns volume id's handle.
func (s *Store) handle(id string) (*openVol, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, _, err := s.getLocked(id)
	return h, err
}

// Open returns volume id's root and accountant for Serve. They stay
// valid until the volume is deleted or promoted over (the root is then
// closed: operations on it fail), whoever else uses them.
func (s *Store) Open(id string) (*os.Root, Space, error) {
	h, err := s.handle(id)
	if err != nil {
		return nil, nil, err
	}
	return h.root, h.sp, nil
}

// Get describes volume id.
func (s *Store) Get(id string) (host.VolumeInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, m, err := s.getLocked(id)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	return host.VolumeInfo{ID: id, LimitBytes: m.LimitBytes, UsedBytes: h.sp.Used(), CreatedAt: m.CreatedAt}, nil
}

// Parent is the volume id was branched from ("" if none).
func (s *Store) Parent(id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	m, err := readMeta(s.volDir(id))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("volume %s: %w", id, host.ErrNotFound)
	}
	return m.Parent, err
}

// List describes every volume, by id.
func (s *Store) List() ([]host.VolumeInfo, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	var out []host.VolumeInfo
	for _, e := range ents {
		if !ValidID(e.Name()) {
			continue
		}
		v, err := s.Get(e.Name())
		if errors.Is(err, host.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Delete removes volume id and its files. Whoever still serves it from
// its root sees every operation fail.
func (s *Store) Delete(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleteLocked(id)
}

func (s *Store) deleteLocked(id string) error {
	if h := s.open[id]; h != nil {
		h.root.Close()
		delete(s.open, id)
	}
	trash := filepath.Join(s.dir, trashDir, id+"-"+randHex(4))
	if err := os.Rename(s.volDir(id), trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("volume %s: %w", id, host.ErrNotFound)
		}
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	syncDir(s.dir)
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}

// Resize sets volume id's limit to limitBytes, which must not be smaller
// than its limit now.
func (s *Store) Resize(id string, limitBytes int64) (host.VolumeInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, m, err := s.getLocked(id)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	if limitBytes < m.LimitBytes {
		return host.VolumeInfo{}, fmt.Errorf("%w: volume %s cannot shrink from %d to %d bytes", host.ErrInvalid, id, m.LimitBytes, limitBytes)
	}
	m.LimitBytes = limitBytes
	if err := writeMeta(s.volDir(id), m); err != nil {
		return host.VolumeInfo{}, fmt.Errorf("resize volume %s: %w", id, ioError(err))
	}
	h.sp.setLimit(limitBytes)
	return host.VolumeInfo{ID: id, LimitBytes: m.LimitBytes, UsedBytes: h.sp.Used(), CreatedAt: m.CreatedAt}, nil
}

// Branch makes the new volume dst a copy of src's tree, file by file:
// reflinks (FICLONE) where the file system can, copies elsewhere; same
// limit, parent src. The caller keeps src's writers still meanwhile (a
// fork's parent is stopped) if the copy must be of one instant.
func (s *Store) Branch(src, dst string) (host.VolumeInfo, error) {
	if err := checkID(dst); err != nil {
		return host.VolumeInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h, m, err := s.getLocked(src)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	nm := meta{LimitBytes: m.LimitBytes, CreatedAt: time.Now().UTC(), Parent: src}
	err = s.install(dst, nm, func(tmp string) error {
		d := filepath.Join(tmp, dataDir)
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		to, err := os.OpenRoot(d)
		if err != nil {
			return err
		}
		defer to.Close()
		return copyTree(h.root, to)
	})
	if err != nil {
		return host.VolumeInfo{}, fmt.Errorf("branch volume %s to %s: %w", src, dst, err)
	}
	return host.VolumeInfo{ID: dst, LimitBytes: nm.LimitBytes, UsedBytes: h.sp.Used(), CreatedAt: nm.CreatedAt}, nil
}

// Promote makes target's tree branch's (an atomic exchange of the two
// data directories), then deletes branch with target's old tree. Target
// keeps the larger of the two limits (a branch that was grown holds more
// than its parent's limit may). Whoever serves either from its root must
// open it again (Open): the old roots are closed.
func (s *Store) Promote(branch, target string) (host.VolumeInfo, error) {
	if branch == target {
		return host.VolumeInfo{}, fmt.Errorf("%w: volume %s cannot be promoted onto itself", host.ErrInvalid, branch)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, bm, err := s.getLocked(branch)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	_, tm, err := s.getLocked(target)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	if bm.LimitBytes > tm.LimitBytes {
		// Grown first: a crash before the exchange leaves target larger,
		// never a tree over its limit.
		tm.LimitBytes = bm.LimitBytes
		if err := writeMeta(s.volDir(target), tm); err != nil {
			return host.VolumeInfo{}, fmt.Errorf("promote volume %s to %s: %w", branch, target, ioError(err))
		}
	}
	for _, id := range []string{branch, target} {
		s.open[id].root.Close()
		delete(s.open, id)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(s.volDir(branch), dataDir), unix.AT_FDCWD, filepath.Join(s.volDir(target), dataDir), unix.RENAME_EXCHANGE); err != nil {
		return host.VolumeInfo{}, fmt.Errorf("promote volume %s to %s: %w", branch, target, err)
	}
	syncDir(s.volDir(target))
	syncDir(s.volDir(branch))
	if err := s.deleteLocked(branch); err != nil {
		return host.VolumeInfo{}, fmt.Errorf("promote volume %s to %s: %w", branch, target, err)
	}
	h, m, err := s.getLocked(target)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	return host.VolumeInfo{ID: target, LimitBytes: m.LimitBytes, UsedBytes: h.sp.Used(), CreatedAt: m.CreatedAt}, nil
}

// copyTree copies every directory, regular file and symlink of from into
// to (empty), with their modes (less setuid and setgid) and times; other
// files are skipped (no volume holds any).
func copyTree(from, to *os.Root) error {
	return fs.WalkDir(from.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		fi, err := from.Lstat(p)
		if err != nil {
			return err
		}
		mode := fi.Mode()
		switch {
		case mode.IsDir():
			if err := to.Mkdir(p, mode.Perm()); err != nil {
				return err
			}
			// Directories' times are set on the way back up would need
			// a second pass; their modes are what matters.
			return to.Chmod(p, mode&(fs.ModePerm|fs.ModeSticky))
		case mode&fs.ModeSymlink != 0:
			target, err := from.Readlink(p)
			if err != nil {
				return err
			}
			return to.Symlink(target, p)
		case mode.IsRegular():
			return cloneFile(from, to, p, fi)
		}
		return nil
	})
}

// cloneFile copies the regular file p of from to to.
func cloneFile(from, to *os.Root, p string, fi fs.FileInfo) error {
	in, err := from.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := to.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	err = volume.CloneOpen(out, in)
	if err == nil {
		err = out.Chmod(fi.Mode().Perm() | fi.Mode()&fs.ModeSticky)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = to.Chtimes(p, fi.ModTime(), fi.ModTime())
	}
	return err
}

// walkUsed counts a volume's bytes: its regular files' sizes rounded up
// to Block, and one Block per directory (but the root), symlink or other
// file.
func walkUsed(root *os.Root) (int64, error) {
	var used int64
	err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile
			}
			return err
		}
		if p == "." {
			return nil
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			used += Blocks(fi.Size())
			return nil
		}
		used += Block
		return nil
	})
	return used, err
}

// Blocks is what a regular file of size bytes counts: its size rounded up
// to Block.
func Blocks(size int64) int64 {
	if size <= 0 {
		return 0
	}
	return (size + Block - 1) / Block * Block
}

// space is a volume's accountant: Space.
type space struct {
	mu    sync.Mutex
	used  int64
	limit int64
}

var _ Space = (*space)(nil)

func (sp *space) Reserve(n int64) error {
	if n <= 0 {
		return nil
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.used+n > sp.limit {
		return syscall.ENOSPC
	}
	sp.used += n
	return nil
}

func (sp *space) Release(n int64) {
	if n <= 0 {
		return
	}
	sp.mu.Lock()
	sp.used = max(0, sp.used-n)
	sp.mu.Unlock()
}

func (sp *space) Used() int64 {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.used
}

func (sp *space) Limit() int64 {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.limit
}

func (sp *space) setLimit(n int64) {
	sp.mu.Lock()
	sp.limit = n
	sp.mu.Unlock()
}

// set replaces the count (a recount after a failure left it unknown).
func (sp *space) set(used int64) {
	sp.mu.Lock()
	sp.used = used
	sp.mu.Unlock()
}

// syncDir flushes a directory's entries.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
