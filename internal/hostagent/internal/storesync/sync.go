// Package storesync keeps a host agent's captures and templates in the
// object store shared by the hosts (docs/storage.md): the background
// jobs that upload, delete and fetch sets with retries and the store's
// garbage collection; snapshots (snapshots/<id>) with the records that
// say which are durable (STORE/stored/<id>.json), their download and
// adoption; paused sandboxes' captures (paused/<id>) and their records;
// templates kept the same across hosts (templates/<key>) and user
// template versions (userfs/NAME/vN); and the bases and seeds (a
// template's, an ancestor snapshot's) that let an upload, a download or
// a pack carry only what differs. It is a package of its own so that the agent's package keeps
// the sandboxes' lifecycle and reaches the store through one narrow type:
// what it needs of the agent it is given as functions (Config), never
// the agent itself.
package storesync

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"golang.org/x/sync/singleflight"
)

// Config is what a Sync works with: the store, the host's templates and
// directories, and the few things of the agent's it needs. The functions
// are called from background jobs and requests alike, concurrently, with
// no lock of the Sync's held.
type Config struct {
	// Store is the object store's chunkstore; nil: the host has none, and
	// only the seeds and bases of its own files (templates, snapshots)
	// and the jobs work.
	Store *chunkstore.Store
	// Templates is the host's template store.
	Templates *template.Store
	// Dir is the store volume's directory: snapshots in Dir/snapshots,
	// records in Dir/stored.
	Dir string
	// Retry is the wait after a failed job before its next attempt,
	// doubling up to 32 times this.
	Retry time.Duration
	// GiveUp, if set, reports a failure of a job that retrying cannot
	// mend: the job ends.
	GiveUp func(error) bool
	Log    *slog.Logger

	// Snapshot describes snapshot id as the host holds it
	// (host.ErrNotFound if it has none).
	Snapshot func(id string) (capture.Info, error)
	// VerifySnapshot checks snapshot id's files against their checksums
	// (host.ErrCorrupt if they do not match), cheaply if they passed
	// before unchanged.
	VerifySnapshot func(id string) error
	// Verified says snapshot id's files, of fingerprint fp, just passed
	// their checks (a download checks them as they come).
	Verified func(id, fp string)
	// CheckSpace fails with host.ErrNoSpace when the host's disk is
	// nearly full.
	CheckSpace func() error
	// Lazy, if set, restores downloaded memory images lazily.
	Lazy Lazy
}

// Lazy is lazy restore as store sync uses it (lazyrestore.Restorer).
// Safe for concurrent use.
type Lazy interface {
	// Worth reports whether set m is worth restoring lazily on this
	// host, whose copies of its chunks are seeds.
	Worth(m *chunkstore.Manifest, seeds []chunkstore.Seed) bool
	// Download is chunkstore.DownloadSeeded of m into dir, but for the
	// memory image, which becomes a link to its lazy file.
	Download(ctx context.Context, m *chunkstore.Manifest, dir string, seeds []chunkstore.Seed) (chunkstore.DownloadStats, error)
	// FetchAll is called before set name leaves the store: it fetches
	// every chunk of it that a lazy restore of this host still needs.
	FetchAll(ctx context.Context, name string) error
}

// Sync is a host's store sync. Safe for concurrent use. New starts
// nothing; jobs run from the first Start until Stop.
type Sync struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex // Lock: jobs, errs, gcAsked, gcDone
	jobs map[string]*Job
	errs map[string]error
	// gcAsked counts the requests for a garbage collection (StartGC);
	// gcDone is the count when the last one that succeeded began.
	gcAsked, gcDone int
	bg              sync.WaitGroup
	bgCtx           context.Context
	bgCancel        context.CancelFunc
	// fetchMu is held by a download of a snapshot (one at a time), a
	// receive of one, and a delete's tombstone and removal of the local
	// files, so that a delete never races a download that would put the
	// files back (LockSnapshots).
	fetchMu sync.Mutex
	// replicas runs one download at a time of each user template version
	// built on another host (usertemplates.go).
	replicas singleflight.Group
}

// New makes the store sync of cfg.
func New(cfg Config) *Sync {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Sync{cfg: cfg, log: cfg.Log, jobs: map[string]*Job{}, errs: map[string]error{}}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	return s
}

// Store is the object store's chunkstore (nil: none).
func (s *Sync) Store() *chunkstore.Store { return s.cfg.Store }

// LockSnapshots takes the lock of downloads, receives and deletes of
// snapshots' files and returns its release: a delete holds it from its
// tombstone to the removal of the files, a receive while it writes them.
func (s *Sync) LockSnapshots() (unlock func()) {
	s.fetchMu.Lock()
	return s.fetchMu.Unlock
}

// ChunkSize is the chunk size of template indexes and packs: the
// store's, or the default without one.
func (s *Sync) ChunkSize() int64 {
	if s.cfg.Store != nil {
		return s.cfg.Store.ChunkSize()
	}
	return chunkstore.DefaultChunkSize
}

// SnapshotDir is snapshot id's directory.
func (s *Sync) SnapshotDir(id string) string { return filepath.Join(s.cfg.Dir, "snapshots", id) }

// SnapshotSet is a snapshot's set name in the chunkstore.
func SnapshotSet(id string) string { return "snapshots/" + id }

// TemplateSet is a template's set name in the chunkstore.
func TemplateSet(key string) string { return "templates/" + key }

// FetchSuffix marks a snapshot directory being downloaded or received.
const FetchSuffix = ".fetch"
