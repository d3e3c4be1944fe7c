// Package transfer moves a snapshot straight from one host agent to
// another as a pack (chunkstore.WritePack), without the object store: in
// practice a cross-host fork's transient capture. The pack carries only
// what differs from the capture's template, which the receiver must hold
// (the same bake: chunkstore.BaseDigest), or from an ancestor snapshot
// the receiver says it holds (its lineage); the receiver keeps what it
// received as the snapshot of the same ID, as if it had fetched it from
// the store, and may start a machine from it while it still arrives
// (Arrival). Nothing of this touches the store. It is a package of its
// own so that the agent's package keeps the sandboxes' lifecycle: what a
// transfer needs of the agent it is given (Config), never the agent.
package transfer

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"golang.org/x/sys/unix"
)

// Config is what transfers work with. The functions are called
// concurrently, with no lock of the Transfers' held.
type Config struct {
	// Sync gives the seeds and bases of packs (this host's templates and
	// durable snapshots), the snapshots' records and lock, and fetches
	// templates a pack needs; its Store may be nil.
	Sync *storesync.Sync
	// CheckSpace fails with host.ErrNoSpace when the host's disk is
	// nearly full.
	CheckSpace func() error
	// Verified says snapshot id's files, of fingerprint fp, just passed
	// their checks (a pack's records are checked as they come).
	Verified func(id, fp string)
	Log      *slog.Logger
}

// Transfers sends and receives packs of snapshots. Safe for concurrent
// use.
type Transfers struct {
	cfg  Config
	sync *storesync.Sync
	log  *slog.Logger
}

// New makes the transfers of cfg.
func New(cfg Config) *Transfers {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Transfers{cfg: cfg, sync: cfg.Sync, log: cfg.Log}
}

// Send writes snapshot si, whose files are in dir, to w as a pack
// diffed against this host's copy of its template (whole chunks if it
// has none) — or, if the receiver holds (held: its HeldSnapshots) the
// snapshot the capture's sandbox was created from, against that
// (LineageBase). host.ErrNotFound if dir lacks the snapshot's files.
func (t *Transfers) Send(ctx context.Context, si capture.Info, dir string, held []string, w io.Writer) (chunkstore.PackStats, error) {
	id := si.ID
	files := map[string]string{}
	for _, f := range []string{capture.MemFile, capture.StateFile, capture.DiskFile, capture.MetaFile, manifest.Name} {
		p := filepath.Join(dir, f)
		if _, err := os.Stat(p); err == nil {
			files[f] = p
		} else if f != manifest.Name { // a transient capture has none
			return chunkstore.PackStats{}, fmt.Errorf("send snapshot %s: %w: its files are not on this host", id, host.ErrNotFound)
		}
	}
	si.Stored, si.StoreError, si.UploadedBytes, si.FetchedBytes = "", "", 0, 0
	meta, err := json.Marshal(si)
	if err != nil {
		return chunkstore.PackStats{}, err
	}
	var bases map[string]chunkstore.Seed
	release := func() {}
	baseName := ""
	if from := LineageBase(si, held); from != "" {
		if bases, release = t.sync.SnapshotBases(ctx, from); bases != nil {
			baseName = storesync.SnapshotSet(from)
		}
	}
	if bases == nil {
		bases, release = t.sync.TemplateBases(ctx, si.Template)
	}
	if bases == nil && t.sync.Store() != nil {
		// A capture of a sandbox restored here from the store, whose
		// template this host lacks: without it every chunk would go
		// whole (the whole memory image, not what the sandbox wrote).
		release()
		t.sync.StartTemplateFetch(si.Template, si.Spec)
		t.sync.AwaitTemplateJob(ctx, si, "a pack waited for this host to fetch the template to diff it against")
		bases, release = t.sync.TemplateBases(ctx, si.Template)
	}
	defer release()
	st, err := chunkstore.WritePack(ctx, w, files, chunkstore.PackOptions{ChunkSize: t.sync.ChunkSize(), Meta: meta, Bases: bases, BaseName: baseName})
	if err != nil {
		return st, fmt.Errorf("send snapshot %s: %w", id, err)
	}
	t.log.Info("snapshot sent", "snapshot_id", id, "base", cmp.Or(baseName, "template"), "dur_ms", st.Dur.Milliseconds(), "setup_ms", st.SetupDur.Milliseconds(), "bytes", st.Bytes, "chunks_base", st.BaseChunks,
		"chunks_patch", st.PatchChunks, "chunks_whole", st.WholeChunks, "zero_chunks", st.ZeroChunks, "chunks_unread", st.Unread,
		"bytes_read", st.BytesRead, "dirty_bytes", si.Capture.DirtyBytes)
	return st, nil
}

// Receive reads a pack of snapshot id (Send's, from another host) from
// r and keeps it as this host's snapshot id, in its directory, complete
// or not at all, telling arr (if not nil) what arrives as it does: the
// snapshot's description and where its files are once they are made,
// when its disk is complete, and how the receive ended; arr is ended on
// every return. It returns the snapshot's description and what the pack
// held. A pack made against a template the host lacks, or holds another
// bake of, waits while the host fetches the object store's copy
// (packSeeds). Errors: host.ErrConflict if the host has a snapshot id
// already; templates.ErrNotFound if the host still lacks the sender's
// copy of the base then, before anything is written (the caller sends it
// another way); host.ErrCorrupt if the stream is cut short or damaged;
// host.ErrInvalid if it is not snapshot id's.
func (t *Transfers) Receive(ctx context.Context, id string, r io.Reader, arr *Arrival) (_ capture.Info, _ chunkstore.PackStats, err error) {
	if arr != nil {
		defer func() { arr.end(err) }()
	}
	if !host.ValidID(id) {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot: %w: id %q must be lowercase letters and digits", host.ErrInvalid, id)
	}
	br := bufio.NewReaderSize(r, 1<<20)
	h, err := chunkstore.ReadPackHeader(br)
	if err != nil {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: %w", id, host.ErrCorrupt, err)
	}
	var si capture.Info
	if err := json.Unmarshal(h.Meta, &si); err != nil || si.ID != id {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: the pack holds snapshot %q", id, host.ErrInvalid, si.ID)
	}
	from, err := storesync.BaseOfPack(h)
	if err != nil {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w", id, err)
	}
	var seeds []chunkstore.Seed
	var release func()
	if from != "" {
		// Diffed against a snapshot this host said it holds.
		var bases map[string]chunkstore.Seed
		bases, release = t.sync.SnapshotBases(ctx, from)
		seeds = storesync.SeedsOf(bases)
	} else {
		seeds, release = t.packSeeds(ctx, h, si)
	}
	defer release()
	t0 := time.Now()
	// One at a time, and never while a delete of it runs (LockSnapshots: as a
	// download from the store).
	defer t.sync.LockSnapshots()()
	dir := t.sync.SnapshotDir(id)
	if _, err := os.Stat(dir); err == nil {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: exists", id, host.ErrConflict)
	}
	if _, ok := t.sync.Record(id); ok {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: exists (or was deleted) here", id, host.ErrConflict)
	}
	if err := t.cfg.CheckSpace(); err != nil {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w", id, err)
	}
	if h.Base != "" && len(seeds) == 0 {
		if from != "" {
			return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: this host has no usable copy of snapshot %s, the pack's base; send it another way", id, templates.ErrNotFound, from)
		}
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: this host has no usable copy of template %s; send it through the object store", id, templates.ErrNotFound, si.Template)
	}
	tmp := dir + storesync.FetchSuffix
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w", id, classifyIO(err))
	}
	var filesDone func(int)
	if arr != nil {
		arr.begin(si, tmp)
		disk := slices.IndexFunc(h.Files, func(f chunkstore.PackFile) bool { return f.Name == capture.DiskFile })
		filesDone = func(n int) {
			if n > disk {
				arr.diskIn()
			}
		}
	}
	st, err := chunkstore.ReadPackNotify(ctx, br, h, tmp, seeds, filesDone)
	if err == nil {
		if verr := capture.CheckDownloaded(tmp); verr != nil {
			err = fmt.Errorf("%w: %w", host.ErrCorrupt, verr)
		}
	}
	if err == nil {
		err = arr.move(dir, func() error {
			if si.Transient {
				return os.Rename(tmp, dir) // as the capture itself: unflushed
			}
			return manifest.Rename(tmp, dir)
		})
	}
	if err != nil {
		arr.WithDir(func(string) error { return os.RemoveAll(tmp) })
		switch {
		case errors.Is(err, chunkstore.ErrPackBase) && from != "":
			return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: this host's copy of snapshot %s is not the sender's: %w", id, templates.ErrNotFound, from, err)
		case errors.Is(err, chunkstore.ErrPackBase):
			// This host's copy changed since packSeeds (or the store
			// holds neither host's): check again for the next pack.
			t.sync.StartTemplateSync(si.Template, false)
			return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: this host's copy of template %s is not the sender's: %w", id, templates.ErrNotFound, si.Template, err)
		case errors.Is(err, chunkstore.ErrPack):
			return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w: %w", id, host.ErrCorrupt, err)
		case ctx.Err() != nil:
			return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w", id, ctx.Err())
		}
		return capture.Info{}, chunkstore.PackStats{}, fmt.Errorf("receive snapshot %s: %w", id, classifyIO(err))
	}
	if fp, err := manifest.Fingerprint(dir); err == nil {
		t.cfg.Verified(id, fp) // checked record by record as it came
	}
	t.log.Info("snapshot received", "snapshot_id", id, "transient", si.Transient, "dur_ms", time.Since(t0).Milliseconds(), "bytes", st.Bytes,
		"chunks_base", st.BaseChunks, "chunks_patch", st.PatchChunks, "chunks_whole", st.WholeChunks, "chunks_reflinked", st.Reflinked)
	return si, st, nil
}

// packSeeds returns this host's copy of the template a pack of snapshot
// si was made against (h's), as seeds of its receive (storesync.Sync.TemplateSeeds).
// If this host lacks that template, or holds another bake of it (hosts
// that baked it at once, before they converged), it first has the host
// fetch or adopt the object store's copy and waits for that, for at most
// packTemplateWait, so that the pack can come in. Refused, the capture
// would go through the store, whose download needs the same template
// chunks and the capture's besides; taken, it comes straight, and so do
// the next ones. It only fetches, never bakes (a bake of its own would
// not be the sender's). A store without a copy (or holding another than
// the sender's) ends the wait at once, and the caller refuses the pack
// as before.
func (t *Transfers) packSeeds(ctx context.Context, h chunkstore.PackHeader, si capture.Info) ([]chunkstore.Seed, func()) {
	seeds, release := t.sync.TemplateSeeds(ctx, si.Template)
	if h.Base == "" || t.sync.Store() == nil || h.BaseHeld(seeds) {
		return seeds, release
	}
	release()
	if len(seeds) == 0 {
		t.sync.StartTemplateFetch(si.Template, si.Spec)
	} else {
		t.sync.StartTemplateSync(si.Template, false)
	}
	t.sync.AwaitTemplateJob(ctx, si, "a pack waited for this host to fetch its template")
	return t.sync.TemplateSeeds(ctx, si.Template)
}

// Arrival is a snapshot being received (Receive) for a machine that
// starts from it before all of it is in (the agent's ReceiveAndCreate). Its
// methods are safe for concurrent use; those of a nil arrival do nothing.
type Arrival struct {
	begun chan struct{} // closed by begin
	disk  chan struct{} // closed by diskIn
	ended chan struct{} // closed by end; err then says how
	si    capture.Info  // set by begin: read it once begun is closed

	mu   sync.Mutex
	dir  string // where its files are now
	err  error
	once sync.Once // of diskIn
}

// NewArrival makes an Arrival for one Receive.
func NewArrival() *Arrival {
	return &Arrival{begun: make(chan struct{}), disk: make(chan struct{}), ended: make(chan struct{})}
}

// Begun is closed once the receive has begun writing the snapshot's
// files: Info is then set.
func (ar *Arrival) Begun() <-chan struct{} { return ar.begun }

// Info describes the snapshot that arrives; read it once Begun is
// closed.
func (ar *Arrival) Info() capture.Info { return ar.si }

// begin says the receive will write the snapshot si into dir.
func (ar *Arrival) begin(si capture.Info, dir string) {
	ar.si = si
	ar.mu.Lock()
	ar.dir = dir
	ar.mu.Unlock()
	close(ar.begun)
}

// diskIn says the disk is complete (its records read and checked).
func (ar *Arrival) diskIn() { ar.once.Do(func() { close(ar.disk) }) }

// move runs fn, which moves the files to dir, with no WithDir meanwhile;
// if it succeeds they are in dir from then on. A nil arrival just runs fn.
func (ar *Arrival) move(dir string, fn func() error) error {
	if ar == nil {
		return fn()
	}
	ar.mu.Lock()
	defer ar.mu.Unlock()
	err := fn()
	if err == nil {
		ar.dir = dir
	}
	return err
}

// end says the receive ended with err (nil: the snapshot is complete).
func (ar *Arrival) end(err error) {
	ar.mu.Lock()
	ar.err = err
	ar.mu.Unlock()
	close(ar.ended)
}

// WithDir runs fn with the directory the files are in, which does not
// change meanwhile (the receive moves it with move).
func (ar *Arrival) WithDir(fn func(dir string) error) error {
	if ar == nil {
		return fn("")
	}
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return fn(ar.dir)
}

// WaitDisk waits until the disk is complete (or the receive ended: its
// error) or ctx ends.
func (ar *Arrival) WaitDisk(ctx context.Context) error {
	select {
	case <-ar.disk:
		return nil
	case <-ar.ended:
		return ar.result()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait waits until the receive ends and returns its error, or ctx's.
func (ar *Arrival) Wait(ctx context.Context) error {
	select {
	case <-ar.ended:
		return ar.result()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ar *Arrival) result() error {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.err
}

// LineageBase returns the durable snapshot capture si derives from
// (capture.Info.Lineage), if held names it: the base Send diffs
// against.
func LineageBase(si capture.Info, held []string) string {
	if si.Lineage == "" || si.Lineage == si.ID || !slices.Contains(held, si.Lineage) {
		return ""
	}
	return si.Lineage
}

// classifyIO is err as host.ErrNoSpace if the disk is full (as the
// agent's classifyIOError).
func classifyIO(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", host.ErrNoSpace, err)
	}
	return err
}
