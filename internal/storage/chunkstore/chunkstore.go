// Package chunkstore keeps sets of large, sparse files — guest memory
// images, disk images — in an objstore.Store as content-addressed chunks
// plus one manifest per set. It is the storage format templates, snapshots
// and paused sandboxes will have in object storage (docs/storage.md).
//
// Layout in the store:
//
//	chunks/<sha256 hex>      one chunk: ChunkSize bytes of a file (the last
//	                         chunk of a file may be shorter)
//	manifests/<name>.json    a Manifest: per file its size and the hash of
//	                         each chunk, "" for a chunk of zeros; and the
//	                         uploader's metadata of the set (Meta)
//	leases/upload-[<owner>-]<id>  an Upload in progress (see GC)
//	leases/gc-[<owner>-]<id>      a GC in progress
//
// Chunks are fixed-size (2 MiB by default; Config.ChunkSize): the size of
// a huge page, so a chunk is the natural unit for faulting guest memory in
// lazily, and large enough that a GiB costs 512 requests, not hundreds of
// thousands. All-zero chunks are never stored — memory and disk images are
// mostly zeros — and holes of the source files (SEEK_DATA/SEEK_HOLE) are
// skipped without being read. A chunk already in the store is not
// uploaded again, so snapshots of one lineage share what they have in
// common. A manifest is written only after every chunk it names is
// durable, so a manifest never names a missing chunk.
//
// Garbage collection. Delete removes only a manifest; GC removes the
// chunks no manifest references. The danger is an Upload that finds a
// chunk already stored (and so does not upload it) while a GC, which has
// not seen the Upload's manifest yet, deletes that chunk. A grace period
// on a chunk's age does not prevent it (an old, orphaned chunk can be
// found and reused at any time) unless every reuse rewrites the chunk;
// so instead both sides take a lease, an object under leases/, and then
// look for the other's:
//
//	Upload: put leases/upload-<id>; wait while a live leases/gc-* exists;
//	        upload chunks; put the manifest; delete its lease.
//	GC:     put leases/gc-<id>; if a live leases/upload-* exists, delete
//	        its lease and fail with ErrBusy; else collect; delete its lease.
//
// Each writes its own lease before it reads the other's, and the store is
// strongly consistent (S3 is; a directory is), so at least one of them
// sees the other: GC never deletes while an Upload may be relying on a
// chunk it found. A lease is rewritten every LeaseTTL/3 while its holder
// works; one not rewritten for LeaseTTL is dead (its holder crashed, or
// lost the store) and is ignored — so a crash holds GC off for at most
// LeaseTTL, and an Upload or GC that could not renew its own lease in
// time stops rather than trust it. Liveness compares the lease's time as
// the store recorded it with this host's clock: clocks must agree to well
// within LeaseTTL (10 minutes by default).
//
// A lease its holder could not delete (the store was down when its Upload
// or GC ended) would hold the other side off until it dies. The Store
// deletes it again before it takes its next lease; and with an Owner (a
// name that outlives the process: a host's data directory's), a Store
// deletes before its first lease the leases an earlier process of its
// owner left — it crashed, or stopped while the store was down.
//
// Reading: Download restores a set's files sparse (zero chunks, and zero
// pages inside chunks, become holes). Open returns a reader of one file
// that fetches each chunk on first touch into a Cache, a local directory
// shared by every reader (and process) of a host — the seed of lazy
// paging of guest memory.
package chunkstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// DefaultChunkSize is the chunk size of new uploads (see the package doc).
const DefaultChunkSize = 2 << 20

// maxChunkSize bounds the chunk size of uploads and of the manifests a
// Store reads: a download holds a chunk per worker in memory.
const maxChunkSize = 64 << 20

// ErrBusy is GC finding an Upload in progress; try again later
// (errs.Unavailable).
var ErrBusy = errs.New(errs.Unavailable, "an upload is in progress")

// Config tunes a Store; the zero value takes the defaults.
type Config struct {
	// ChunkSize of new uploads: a multiple of 4096 up to 64 MiB. Manifests
	// record theirs, so sets of several chunk sizes live side by side.
	ChunkSize int64
	// Workers is how many chunks are read, hashed and uploaded (or
	// downloaded) at once; default 4.
	Workers int
	// Cache is where Open keeps fetched chunks; Open fails without one.
	Cache *Cache
	// LeaseTTL is how long a lease lives unrenewed (see the package doc);
	// default 10 minutes.
	LeaseTTL time.Duration
	// Owner names this Store's leases: letters and digits, unique among
	// the Stores that share the object store and the same across restarts
	// (a host's data directory's ID). Before its first lease, a Store
	// deletes the leases of its owner that an earlier process left, so a
	// crash does not hold GC or uploads off for LeaseTTL. Two Stores open
	// at once with one Owner would delete each other's leases. Empty: no
	// owner, leftovers die in LeaseTTL.
	Owner string
}

// Store keeps sets of files as chunks in an objstore.Store. It is safe for
// concurrent use, by goroutines and by hosts sharing the object store.
type Store struct {
	objs objstore.Store
	cfg  Config
	// pollEvery is how often an Upload looks again whether a GC ended.
	pollEvery time.Duration

	leaseMu sync.Mutex
	held    map[string]bool // the keys of the leases this Store holds
	orphans map[string]bool // leases this Store released but could not delete
	tidied  bool            // the leases an earlier process of Owner left are gone
}

// New returns a Store over objs; it does no I/O.
func New(objs objstore.Store, cfg Config) (*Store, error) {
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	if cfg.ChunkSize%4096 != 0 || cfg.ChunkSize <= 0 || cfg.ChunkSize > maxChunkSize {
		return nil, fmt.Errorf("chunk size %d: want a multiple of 4096 up to 64 MiB", cfg.ChunkSize)
	}
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("workers %d: want at least 1", cfg.Workers)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 10 * time.Minute
	}
	if cfg.LeaseTTL < time.Second {
		return nil, fmt.Errorf("lease TTL %v: want at least a second", cfg.LeaseTTL)
	}
	for _, c := range cfg.Owner {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return nil, fmt.Errorf("owner %q: want letters and digits only", cfg.Owner)
		}
	}
	return &Store{objs: objs, cfg: cfg, pollEvery: 500 * time.Millisecond,
		held: map[string]bool{}, orphans: map[string]bool{}}, nil
}

// Manifest lists the files of one set.
type Manifest struct {
	Version   int    `json:"version"`
	Name      string `json:"name"`
	ChunkSize int64  `json:"chunk_size"`
	Files     []File `json:"files"` // sorted by name
	// Meta is what the uploader says about the set (UploadMeta), written
	// with the manifest, so that it is in the store exactly when the set
	// is: a host that has never seen the set learns what it is with one
	// request. Nil if none was given.
	Meta json.RawMessage `json:"meta,omitempty"`
}

// MaxMeta bounds a manifest's Meta.
const MaxMeta = 1 << 20

// File is one file of a Manifest.
type File struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	// Chunks holds the SHA-256 (hex) of each chunk in order; "" is a chunk
	// of zeros, which is not stored.
	Chunks []string `json:"chunks"`
	// Deltas maps the index of each chunk stored as a delta (delta.go)
	// to how it is made; such a chunk has no object of its own hash.
	Deltas map[int]Delta `json:"deltas,omitempty"`
}

// File returns the file called name.
func (m *Manifest) File(name string) (File, bool) {
	i := slices.IndexFunc(m.Files, func(f File) bool { return f.Name == name })
	if i < 0 {
		return File{}, false
	}
	return m.Files[i], true
}

// chunkLen is the length of chunk i of a file of size bytes.
func chunkLen(size, chunkSize int64, i int) int64 {
	return min(chunkSize, size-int64(i)*chunkSize)
}

// Manifest versions: 2 has deltas (File.Deltas), 1 has none.
const (
	manifestVersion      = 1
	manifestVersionDelta = 2
)

func chunkKey(hash string) string    { return "chunks/" + hash }
func manifestKey(name string) string { return "manifests/" + name + ".json" }

// validName: a set's name is a key path ("snapshots/abc"); a file's name
// is one component.
func validName(name string) error {
	if err := objstore.ValidKey(manifestKey(name)); err != nil {
		return fmt.Errorf("name %q: %w", name, err)
	}
	return nil
}

func validFileName(name string) error {
	if name == "" || strings.Contains(name, "/") || objstore.ValidKey(name) != nil {
		return fmt.Errorf("file name %q: want one path component not starting with a dot", name)
	}
	return nil
}

// Manifest reads the manifest of name; objstore.ErrNotFound if there is
// none.
func (s *Store) Manifest(ctx context.Context, name string) (*Manifest, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	rc, err := s.objs.Get(ctx, manifestKey(name))
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", name, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", name, err)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", name, err)
	}
	return &m, nil
}

// check rejects a manifest this code cannot read safely.
func (m *Manifest) check() error {
	if m.Version != manifestVersion && m.Version != manifestVersionDelta {
		return fmt.Errorf("version %d, want %d or %d", m.Version, manifestVersion, manifestVersionDelta)
	}
	if m.ChunkSize <= 0 || m.ChunkSize > maxChunkSize {
		return fmt.Errorf("chunk size %d, want 1 to %d", m.ChunkSize, maxChunkSize)
	}
	for _, f := range m.Files {
		if err := validFileName(f.Name); err != nil {
			return err
		}
		if f.Size < 0 || int64(len(f.Chunks)) != (f.Size+m.ChunkSize-1)/m.ChunkSize {
			return fmt.Errorf("file %s: %d chunks for %d bytes", f.Name, len(f.Chunks), f.Size)
		}
		for _, h := range f.Chunks {
			if h != "" && !validHash(h) {
				return fmt.Errorf("file %s: chunk hash %q", f.Name, h)
			}
		}
		if len(f.Deltas) > 0 && m.Version != manifestVersionDelta {
			return fmt.Errorf("file %s: deltas in a version %d manifest", f.Name, m.Version)
		}
		for i, d := range f.Deltas {
			if i < 0 || i >= len(f.Chunks) || f.Chunks[i] == "" {
				return fmt.Errorf("file %s: delta of chunk %d", f.Name, i)
			}
			if !validHash(d.Patch) || (d.Base != "" && !validHash(d.Base)) {
				return fmt.Errorf("file %s: delta of chunk %d: hash %q or %q", f.Name, i, d.Base, d.Patch)
			}
		}
	}
	return nil
}

// Objects lists the hashes of the objects under chunks/ that m needs: each
// chunk's, or for a delta its base's and its patch's.
func (m *Manifest) Objects(yield func(string)) {
	for _, f := range m.Files {
		for i, h := range f.Chunks {
			if d, ok := f.Deltas[i]; ok {
				if d.Base != "" {
					yield(d.Base)
				}
				yield(d.Patch)
			} else if h != "" {
				yield(h)
			}
		}
	}
}

func validHash(h string) bool {
	_, err := hex.DecodeString(h)
	return len(h) == 64 && err == nil && strings.ToLower(h) == h
}

// putManifest writes m; with ifAbsent only if the store holds no manifest
// of its name (objstore.ErrExists), where the store can tell.
func (s *Store) putManifest(ctx context.Context, m *Manifest, ifAbsent bool) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	put := s.objs.Put
	if c, ok := s.objs.(objstore.Creator); ok && ifAbsent {
		put = c.Create
	}
	if err := put(ctx, manifestKey(m.Name), bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("write manifest %s: %w", m.Name, err)
	}
	return nil
}

// Names lists the names of every set in the store, sorted.
func (s *Store) Names(ctx context.Context) ([]string, error) { return s.NamesUnder(ctx, "") }

// NamesUnder lists the names of the sets whose name starts with prefix
// ("userfs/"), sorted, in one listing of the store.
func (s *Store) NamesUnder(ctx context.Context, prefix string) ([]string, error) {
	var names []string
	for in, err := range s.objs.List(ctx, "manifests/"+prefix) {
		if err != nil {
			return nil, fmt.Errorf("list manifests: %w", err)
		}
		if n, ok := strings.CutSuffix(strings.TrimPrefix(in.Key, "manifests/"), ".json"); ok {
			names = append(names, n)
		}
	}
	return names, nil
}

// Delete removes the manifest of name (objstore.ErrNotFound if there is
// none); its chunks stay until GC finds no other manifest uses them.
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if _, err := s.objs.Stat(ctx, manifestKey(name)); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	if err := s.objs.Delete(ctx, manifestKey(name)); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// lease is one held lease (see the package doc).
type lease struct {
	s    *Store
	key  string
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	renewed time.Time // when the last write of the lease began
}

func (s *Store) acquire(ctx context.Context, kind string) (*lease, error) {
	s.tidyLeases(ctx)
	id := make([]byte, 8)
	rand.Read(id)
	key := "leases/" + kind + "-" + hex.EncodeToString(id)
	if s.cfg.Owner != "" {
		key = "leases/" + kind + "-" + s.cfg.Owner + "-" + hex.EncodeToString(id)
	}
	l := &lease{s: s, key: key, stop: make(chan struct{}), done: make(chan struct{})}
	s.leaseMu.Lock()
	s.held[key] = true
	s.leaseMu.Unlock()
	if err := l.write(ctx); err != nil {
		l.forget(ctx)
		return nil, fmt.Errorf("take %s lease: %w", kind, err)
	}
	go l.renew(context.WithoutCancel(ctx))
	return l, nil
}

// tidyLeases deletes the leases of this Store that nobody holds: those it
// could not delete when it released them, and (once, with an Owner)
// those an earlier process of its owner left. Failures are left for the
// next call: meanwhile such a lease dies in LeaseTTL.
func (s *Store) tidyLeases(ctx context.Context) {
	s.leaseMu.Lock()
	listed := s.cfg.Owner == "" || s.tidied
	s.leaseMu.Unlock()
	var left []string
	if !listed {
		listed = true
		for in, err := range s.objs.List(ctx, "leases/") {
			if err != nil {
				listed = false
				break
			}
			if _, rest, _ := strings.Cut(strings.TrimPrefix(in.Key, "leases/"), "-"); strings.HasPrefix(rest, s.cfg.Owner+"-") {
				left = append(left, in.Key)
			}
		}
	}
	s.leaseMu.Lock()
	s.tidied = s.tidied || listed
	for _, key := range left {
		if !s.held[key] { // not taken since the listing by this Store
			s.orphans[key] = true
		}
	}
	orphans := slices.Collect(maps.Keys(s.orphans))
	s.leaseMu.Unlock()
	for _, key := range orphans {
		if err := s.objs.Delete(ctx, key); err == nil || errors.Is(err, objstore.ErrNotFound) {
			s.leaseMu.Lock()
			delete(s.orphans, key)
			s.leaseMu.Unlock()
		}
	}
}

func (l *lease) write(ctx context.Context) error {
	start := time.Now()
	body := []byte(start.UTC().Format(time.RFC3339Nano))
	if err := l.s.objs.Put(ctx, l.key, bytes.NewReader(body), int64(len(body))); err != nil {
		return err
	}
	l.mu.Lock()
	l.renewed = start
	l.mu.Unlock()
	return nil
}

func (l *lease) renew(ctx context.Context) {
	defer close(l.done)
	ttl := l.s.cfg.LeaseTTL
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			wctx, cancel := context.WithTimeout(ctx, ttl/3)
			l.write(wctx) // a failure shows in valid()
			cancel()
		}
	}
}

// valid reports whether the lease is still live for others: written less
// than TTL ago, with a margin for the clocks.
func (l *lease) valid() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ttl := l.s.cfg.LeaseTTL
	if age := time.Since(l.renewed); age > ttl*4/5 {
		return fmt.Errorf("lease %s was last renewed %v ago (TTL %v): the store was unreachable too long", l.key, age.Round(time.Second), ttl)
	}
	return nil
}

func (l *lease) release(ctx context.Context) {
	close(l.stop)
	<-l.done
	l.forget(ctx)
}

// forget deletes the lease from the store; if that fails, the next
// lease this Store takes deletes it (tidyLeases).
func (l *lease) forget(ctx context.Context) {
	err := l.s.objs.Delete(context.WithoutCancel(ctx), l.key)
	l.s.leaseMu.Lock()
	delete(l.s.held, l.key)
	if err != nil && !errors.Is(err, objstore.ErrNotFound) {
		l.s.orphans[l.key] = true
	}
	l.s.leaseMu.Unlock()
}

// liveLeases lists the live leases of kind; with removeStale it deletes
// the dead ones it finds.
func (s *Store) liveLeases(ctx context.Context, kind string, removeStale bool) ([]string, error) {
	var live []string
	for in, err := range s.objs.List(ctx, "leases/"+kind+"-") {
		if err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		if time.Since(in.ModTime) < s.cfg.LeaseTTL {
			live = append(live, in.Key)
		} else if removeStale {
			s.objs.Delete(ctx, in.Key)
		}
	}
	return live, nil
}

// GC deletes every chunk that no manifest references and returns how
// many it deleted. It fails with ErrBusy, deleting nothing, while an
// Upload is in progress (see the package doc).
func (s *Store) GC(ctx context.Context) (removed int, err error) {
	l, err := s.acquire(ctx, "gc")
	if err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	defer l.release(ctx)
	uploads, err := s.liveLeases(ctx, "upload", true)
	if err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	if len(uploads) > 0 {
		return 0, fmt.Errorf("gc: %w (%s)", ErrBusy, strings.Join(uploads, ", "))
	}
	names, err := s.Names(ctx)
	if err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	used := map[string]bool{}
	for _, n := range names {
		m, err := s.Manifest(ctx, n)
		if errors.Is(err, objstore.ErrNotFound) {
			continue // deleted since the listing: its chunks may go
		}
		if err != nil {
			// An unreadable manifest may reference anything: collecting
			// now could break it further.
			return 0, fmt.Errorf("gc: %w", err)
		}
		m.Objects(func(h string) { used[h] = true })
	}
	// Collect the victims first: deleting while listing could make a
	// listing skip entries.
	var victims []string
	for in, err := range s.objs.List(ctx, "chunks/") {
		if err != nil {
			return 0, fmt.Errorf("gc: %w", err)
		}
		if !used[strings.TrimPrefix(in.Key, "chunks/")] {
			victims = append(victims, in.Key)
		}
	}
	for _, k := range victims {
		if err := l.valid(); err != nil {
			return removed, fmt.Errorf("gc: %w", err)
		}
		if err := s.objs.Delete(ctx, k); err != nil {
			return removed, fmt.Errorf("gc: %w", err)
		}
		removed++
	}
	return removed, nil
}
