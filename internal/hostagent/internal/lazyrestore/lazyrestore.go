// Package lazyrestore restores captures from the object store with their
// memory paged in on first touch (docs/lazy-restore.md): the host's one
// lazymem mount, the download of a set but for its memory image, the
// fetch of every chunk before a set leaves the store, and the copy of a
// lazily restored machine's memory when it is captured. It is the agent's
// use of package lazymem, a package of its own so that the agent's
// package keeps the sandboxes' lifecycle: what it needs of the agent it
// is given (Host), never the agent.
package lazyrestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/hostagent/lazymem"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"golang.org/x/sys/unix"
)

// Lazy restore (hostagent.Config.Lazy; docs/lazy-restore.md).
//
// A snapshot or paused sandbox this host does not hold is fetched without
// its memory image: the agent downloads vm.state, rootfs.ext4 and the
// set's small files, checks them, and makes vm.mem a symbolic link to the
// set's file on the host's lazymem mount (STORE/lazy). Everything
// downstream is unchanged:
// a restore hard-links the symbolic link into the sandbox's directory
// (link(2) does not follow it), QEMU and the jail's bind mount follow it
// to the FUSE file, whose pages are fetched on first touch through the
// chunk cache. The first lazy restore of a set records the chunks it
// touched (Lazy.RecordFor after its first fault) as the set's working
// set in the store; later ones prefetch it.
//
// Before this host removes a set from the store (a stale capture after a
// resume, a deleted snapshot), it fetches every chunk of the set's lazy
// file it lacks (FetchAll); a capture of a lazily restored machine
// copies its image through the mount (CloneMemory).
//
// One mount per host, not per machine: machines restored from one set
// share the file's page cache, as local restores share a memory image's.
// It is made at start (Recover: links fetched before a restart resolve
// through it) or on first use, and unmounted by Close after every machine
// is stopped. With LazyConfig.Holder, a holder process serves the mount
// and asks the agent for the files' content: a machine restored lazily
// outlives the agent (its misses wait for the next one, which attaches
// at Recover); Detach leaves the holder. Without one, a machine restored
// lazily depends on this process: if the agent dies, its next page-cache
// miss fails (SIGBUS in QEMU).

// Config turns on lazy restore of memory images (hostagent.LazyConfig).
type Config struct {
	// Chunks is the agent's Store with a chunk cache (chunkstore.Config.Cache),
	// best in STORE/ChunkCacheDir (DATA_DIR/store/chunk-cache).
	Chunks *chunkstore.Store
	// Objects is the object store under Chunks: working sets are kept there.
	Objects objstore.Store
	// RecordFor is how long after its first fault a set's first lazy
	// restore records the chunks touched; default 3 s.
	RecordFor time.Duration
	// NoFetchAll leaves untouched chunks in the store (measurements only:
	// without the background fetch of the whole image, a snapshot deleted
	// from the store takes pages its lazily restored machines still need).
	NoFetchAll bool
	// NoPrefetch ignores recorded working sets (measurements).
	NoPrefetch bool
	// ReadAheadKiB is the kernel's readahead on the lazy files
	// (lazymem.Config.MaxReadAhead); default 128.
	ReadAheadKiB int
	// Holder is the executable of the holder process that serves the
	// mount (lazymem.Config.Holder; its main calls lazymem.HolderMain):
	// a lazily restored machine then outlives this agent, its page-cache
	// misses waiting for the next one. Empty: the agent serves the mount,
	// and such a machine dies at its next miss once the agent is gone.
	Holder string
	// MinRemoteBytes: a set is restored lazily only if its memory image
	// has at least this much to fetch whole from the store (chunks that
	// are not zeros, not deltas and not on this host in a seed, its
	// template); default 64 MiB. Below it, the seeded download is faster
	// (measured: with the template on the host, a snapshot's download
	// fetched 7 MiB and its first exec came 0.55 s after the create;
	// lazily, without seeds, 96 MiB and 0.74-0.95 s). Negative: always.
	MinRemoteBytes int64
}

// Host is what a Restorer needs of its host agent.
type Host struct {
	// Dir is the store volume's directory: the mount is Dir/lazy.
	Dir string
	// Store is the object store's chunkstore the sets are downloaded
	// from.
	Store *chunkstore.Store
	// TemplateSeeds are this host's copy of template key as seeds of a
	// download, open until release (storesync.Sync.TemplateSeeds).
	TemplateSeeds func(ctx context.Context, key string) (seeds []chunkstore.Seed, release func())
	Log           *slog.Logger
}

// Restorer is a host's lazy restore. Safe for concurrent use. A Restorer
// of a nil Config restores nothing lazily but still serves the mount
// an earlier run made (Stats, MemStats, CloneMemory, Close).
type Restorer struct {
	cfg  *Config
	host Host
	log  *slog.Logger

	mu sync.Mutex
	fs *lazymem.FS // made on first use (Mount)
}

// New makes the lazy restore of cfg (nil: off) on host. It mounts
// nothing yet.
func New(cfg *Config, h Host) *Restorer {
	if h.Log == nil {
		h.Log = slog.New(slog.DiscardHandler)
	}
	return &Restorer{cfg: cfg, host: h, log: h.Log}
}

// Path is the lazy file of set name on the mount ("" if not mounted).
func (r *Restorer) Path(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fs == nil {
		return ""
	}
	return r.fs.Path(name)
}

// Worth reports whether set m is worth restoring lazily on this host,
// whose local copies of its chunks are seeds (see MinRemoteBytes).
func (r *Restorer) Worth(m *chunkstore.Manifest, seeds []chunkstore.Seed) bool {
	min := r.cfg.MinRemoteBytes
	if min == 0 {
		min = 64 << 20
	}
	if min < 0 {
		return true
	}
	f, ok := m.File(capture.MemFile)
	if !ok {
		return false
	}
	local := map[string]bool{}
	for _, sd := range seeds {
		if sd.ChunkSize == m.ChunkSize {
			for _, h := range sd.Chunks {
				local[h] = true
			}
		}
	}
	var remote int64
	for i, h := range f.Chunks {
		if _, delta := f.Deltas[i]; h != "" && !delta && !local[h] {
			remote += m.ChunkSize
		}
	}
	return remote >= min
}

// ChunkCacheDir is where in the store a host with lazy restore keeps its
// chunk cache (LazyConfig.Chunks' chunkstore.Cache): inside the store
// volume, its chunks can be reflinked into the capture of a lazily
// restored machine (assemble).
const ChunkCacheDir = "chunk-cache"

// Mount returns the host's lazymem mount, mounting it if needed.
func (r *Restorer) Mount() (*lazymem.FS, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fs != nil && r.fs.Broken() {
		// The holder process died (its machines fail at their next
		// miss): new restores need a new one.
		r.log.Error("lazy memory files: their holder process is gone; starting another")
		r.fs.Leave()
		r.fs = nil
	}
	if r.fs != nil {
		return r.fs, nil
	}
	lc := r.cfg
	if lc.Chunks == nil || lc.Objects == nil {
		return nil, errors.New("lazy restore: LazyConfig needs Chunks (with a chunk cache) and Objects")
	}
	rec := lc.RecordFor
	if rec == 0 {
		rec = 3 * time.Second
	}
	images := &lazymem.StoreImages{Chunks: lc.Chunks, Objects: lc.Objects, File: capture.MemFile, RecordFor: rec,
		FetchAll: !lc.NoFetchAll, NoPrefetch: lc.NoPrefetch,
		OnError: func(name string, err error) { r.log.Warn("working set of a lazy restore", "set", name, "err", err) },
		Seeds:   r.seeds}
	fsys, err := lazymem.Mount(lazymem.Config{Dir: filepath.Join(r.host.Dir, "lazy"), Resolve: images.Resolve, Log: r.log,
		MaxReadAhead: lc.ReadAheadKiB << 10, Holder: lc.Holder})
	if err != nil {
		return nil, err
	}
	r.fs = fsys
	return fsys, nil
}

// seeds are this host's copy of the template of set m, which its
// metadata names (a snapshot's template, a paused sandbox's record's):
// its chunks are read from there rather than fetched. The files stay open
// until the mount closes.
func (r *Restorer) seeds(ctx context.Context, m *chunkstore.Manifest) ([]chunkstore.Seed, func()) {
	var meta struct {
		Template string `json:"template"`
		Sandbox  struct {
			Template string `json:"template"`
		} `json:"sandbox"`
	}
	json.Unmarshal(m.Meta, &meta) // no metadata: no template
	key := meta.Template
	if key == "" {
		key = meta.Sandbox.Template
	}
	if key == "" {
		return nil, func() {}
	}
	return r.host.TemplateSeeds(ctx, key)
}

// Leave stops serving the lazymem mount but leaves its holder
// process (if any) holding it for the next agent: the machines mapping
// its files run on (Detach).
func (r *Restorer) Leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fs == nil {
		return
	}
	r.fs.Leave()
	r.fs = nil
}

// Held reports whether the lazymem mount is served by a holder
// process, so that lazily restored machines outlive this agent.
func (r *Restorer) Held() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fs != nil && r.fs.Held()
}

// Close unmounts the lazymem mount; the machines must be stopped.
func (r *Restorer) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fs == nil {
		return nil
	}
	err := r.fs.Close()
	r.fs = nil
	return err
}

// MemStats is what the memory image mem of a sandbox, if it is a lazy
// file, has read and fetched so far; nil if it is not one. mem is then
// a hard link to the symbolic link into the mount that the fetch made.
func (r *Restorer) MemStats(mem string) *host.LazyMemStats {
	r.mu.Lock()
	fsys := r.fs
	r.mu.Unlock()
	if fsys == nil {
		return nil
	}
	target, err := os.Readlink(mem)
	if err != nil || filepath.Dir(target) != filepath.Dir(fsys.Path("x")) {
		return nil
	}
	set, ok := lazymem.SetOf(filepath.Base(target))
	if !ok {
		return nil
	}
	st, ok := fsys.Stats(set)
	if !ok {
		return nil
	}
	return &host.LazyMemStats{ImageBytes: st.Size, ReadBytes: st.BytesRead, FetchedBytes: st.SourceBytes, LocalBytes: st.LocalBytes}
}

// Stats reports the lazy file of set name (e.g. "snapshots/<id>"),
// if this host served one.
func (r *Restorer) Stats(name string) (lazymem.Stats, bool) {
	r.mu.Lock()
	fsys := r.fs
	r.mu.Unlock()
	if fsys == nil {
		return lazymem.Stats{}, false
	}
	return fsys.Stats(name)
}

// Download is DownloadSeeded of set m into dir for a lazy restore:
// every file but the memory image is downloaded (from seeds where they
// hold its chunks); the memory image becomes a symbolic link to its lazy
// file. Its file is looked up first, so that its working set is
// prefetched while the rest downloads. The caller checks the files
// (capture.CheckDownloaded: sizes, through the link for the memory image, whose
// chunks are checked one by one as they arrive). Errors keep their
// classes (objstore.ErrUnavailable, ErrNotFound, manifest.ErrCorrupt).
func (r *Restorer) Download(ctx context.Context, m *chunkstore.Manifest, dir string, seeds []chunkstore.Seed) (chunkstore.DownloadStats, error) {
	var st chunkstore.DownloadStats
	fsys, err := r.Mount()
	if err != nil {
		return st, err
	}
	rest := *m
	rest.Files = nil
	for _, f := range m.Files {
		if f.Name != capture.MemFile {
			rest.Files = append(rest.Files, f)
		}
	}
	if len(rest.Files) == len(m.Files) {
		return st, fmt.Errorf("%w: set %s has no %s", manifest.ErrCorrupt, m.Name, capture.MemFile)
	}
	if _, err := os.Stat(fsys.Path(m.Name)); err != nil {
		return st, fmt.Errorf("lazy memory image of %s: %w", m.Name, err)
	}
	if st, err = r.host.Store.DownloadSeeded(ctx, &rest, dir, seeds); err != nil {
		return st, err
	}
	return st, os.Symlink(fsys.Path(m.Name), filepath.Join(dir, capture.MemFile))
}

// FetchAll is called before set name leaves the store: machines of
// this host restored lazily from it must have every chunk of its memory
// image in the chunk cache first.
func (r *Restorer) FetchAll(ctx context.Context, name string) error {
	if r.cfg == nil {
		return nil
	}
	r.mu.Lock()
	fsys := r.fs
	r.mu.Unlock()
	if fsys == nil {
		return nil
	}
	return fsys.FetchAll(ctx, name)
}

// MountAtStart, at start, mounts the lazymem mount that the memory images of
// sets fetched lazily before a restart point to.
func (r *Restorer) MountAtStart() {
	if r.cfg == nil {
		return
	}
	if _, err := r.Mount(); err != nil {
		r.log.Error("mount lazy memory files", "err", err)
	}
}

// CloneMemory is the Cloner of a capture's memory image (fork, snapshot,
// pause): volume.Clone, except that the image of a lazily restored
// machine, on the lazymem mount where nothing can be reflinked, is made
// from its chunks' own files (assemble: the template's chunks
// reflinked, the chunk cache's reflinked or copied), or failing that
// copied (sparse) through the mount. Either runs while the machine is
// paused.
func (r *Restorer) CloneMemory(src, dst string) error {
	err := volume.Clone(src, dst)
	if !errors.Is(err, volume.ErrNoReflink) || !r.isLazyFile(src) {
		return err
	}
	err = r.assemble(src, dst)
	if err == nil {
		return nil
	}
	os.Remove(dst)
	r.log.Warn("assemble a lazily restored memory image from its chunks: copying it through the mount", "err", err)
	if err := copySparse(src, dst); err != nil {
		os.Remove(dst)
		return fmt.Errorf("copy lazily restored memory image: %w", err)
	}
	return nil
}

// assemble makes dst a copy of src, a file of the lazymem mount, from
// where its chunks are on this host (lazymem.FS.Layout): reflinked where
// the file system can (the template's chunks, in the store), else copied
// in the kernel (copy_file_range), else read and written; chunks of
// zeros stay holes. Chunks the host lacks are fetched first.
func (r *Restorer) assemble(src, dst string) error {
	r.mu.Lock()
	fsys := r.fs
	r.mu.Unlock()
	target, err := filepath.EvalSymlinks(src)
	if err != nil {
		return err
	}
	set, ok := lazymem.SetOf(filepath.Base(target))
	if fsys == nil || !ok {
		return fmt.Errorf("%s is no lazy file of this agent: %w", src, errors.ErrUnsupported)
	}
	st, err := os.Stat(target)
	if err != nil {
		return err
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	locs, err := fsys.Layout(ctx, set)
	if err != nil {
		return err
	}
	out, err := createLike(dst, st)
	if err != nil {
		return err
	}
	defer out.Close()
	var reflinked, copied int
	var off int64
	for _, l := range locs {
		at := off
		off += l.Len
		in := l.File
		if in == nil {
			if l.Path == "" {
				continue // zeros: a hole
			}
			if in, err = os.Open(l.Path); err != nil {
				return err
			}
		}
		cloned, err := cloneRange(out, in, l.Off, l.Len, at)
		if l.File == nil {
			in.Close()
		}
		if err != nil {
			return err
		}
		if cloned {
			reflinked++
		} else {
			copied++
		}
	}
	if off != st.Size() {
		return fmt.Errorf("the chunks of %s make %d bytes, the file has %d", set, off, st.Size())
	}
	r.log.Debug("assembled a lazily restored memory image from its chunks", "set", set, "chunks_reflinked", reflinked, "chunks_copied", copied,
		"dur_ms", time.Since(t0).Milliseconds())
	return out.Close()
}

// cloneRange puts n bytes at off of in at at of out: a reflink if the
// file system can (true), else a copy.
func cloneRange(out, in *os.File, off, n, at int64) (bool, error) {
	err := unix.IoctlFileCloneRange(int(out.Fd()), &unix.FileCloneRange{Src_fd: int64(in.Fd()), Src_offset: uint64(off), Src_length: uint64(n), Dest_offset: uint64(at)})
	if err == nil {
		return true, nil
	}
	src, dst, left := off, at, n
	for left > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &src, int(out.Fd()), &dst, int(left), 0)
		if err != nil || c == 0 {
			break
		}
		left -= int64(c)
	}
	if left == 0 {
		return false, nil
	}
	// No copy_file_range between these files (across file systems of
	// different kinds): read and write, leaving zero pages holes.
	buf := make([]byte, min(left, 2<<20))
	for left > 0 {
		m, err := in.ReadAt(buf[:min(int64(len(buf)), left)], src)
		if m == 0 {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return false, err
		}
		if err := writeData(out, buf[:m], dst); err != nil {
			return false, err
		}
		src, dst, left = src+int64(m), dst+int64(m), left-int64(m)
	}
	return false, nil
}

// isLazyFile reports whether path leads to a file on the lazymem mount.
func (r *Restorer) isLazyFile(path string) bool {
	p, err := filepath.EvalSymlinks(path)
	return err == nil && strings.HasPrefix(p, filepath.Join(r.host.Dir, "lazy")+"/")
}

// copySparse copies src to a new file dst, reading only its data
// (SEEK_DATA: the lazy file reports zero chunks as holes) and leaving
// holes for zero pages.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := createLike(dst, st)
	if err != nil {
		return err
	}
	defer out.Close()
	buf := make([]byte, 2<<20)
	fd := int(in.Fd())
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			data = off // no SEEK_DATA: all of it is data
		}
		end, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			end = st.Size()
		}
		for off = data; off < end; {
			n, err := in.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
			if n == 0 && err != nil {
				return err
			}
			if err := writeData(out, buf[:n], off); err != nil {
				return err
			}
			off += int64(n)
		}
	}
	return out.Close()
}

// createLike creates dst, a new file of st's mode and size (a hole), for
// a copy of the file st describes.
func createLike(dst string, st os.FileInfo) (*os.File, error) {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return nil, err
	}
	if err := out.Truncate(st.Size()); err != nil {
		out.Close()
		return nil, err
	}
	return out, nil
}

// writeData writes b at off of out, one write per run of pages that are
// not all zeros: those stay holes.
func writeData(out *os.File, b []byte, off int64) error {
	start := -1
	for p := 0; ; p += 4096 {
		end := p >= len(b)
		data := !end && !allZero(b[p:min(p+4096, len(b))])
		switch {
		case data && start < 0:
			start = p
		case !data && start >= 0:
			if _, err := out.WriteAt(b[start:min(p, len(b))], off+int64(start)); err != nil {
				return err
			}
			start = -1
		}
		if end {
			return nil
		}
	}
}

// allZero reports whether b (at most a page) is all zeros.
func allZero(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }

var zeroPage [4096]byte
