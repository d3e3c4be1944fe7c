package hostagent

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
)

// Direct transfers: a snapshot (in practice a cross-host fork's transient
// capture) sent from this host straight to another as a pack
// (chunkstore.WritePack), without the object store. The pack carries only
// what differs from the capture's template, which the receiver must hold
// (the same bake: chunkstore.BaseDigest); the receiver keeps what it
// received as the snapshot of the same ID, as if it had fetched it from
// the store, and creates from it as usual. Nothing of this touches the
// store: a transient capture is uploaded only once someone waits for it
// to be durable (AwaitStored), which a fork that went direct never does.

// SendSnapshot writes snapshot id, held on this host, to w as a pack
// diffed against this host's copy of its template (whole chunks if it has
// none) — or, if the receiver holds (held: its HeldSnapshots) the
// snapshot the capture's sandbox was created from, against that
// (lineage.go). ErrNotFound if the host does not hold the snapshot's
// files.
func (a *Agent) SendSnapshot(ctx context.Context, id string, held []string, w io.Writer) (chunkstore.PackStats, error) {
	si, err := a.GetSnapshot(id)
	if err != nil {
		return chunkstore.PackStats{}, err
	}
	dir := a.snapshotDir(id)
	files := map[string]string{}
	for _, f := range []string{memFile, stateFile, diskFile, snapshotMeta, manifest.Name} {
		p := filepath.Join(dir, f)
		if _, err := os.Stat(p); err == nil {
			files[f] = p
		} else if f != manifest.Name { // a transient capture has none
			return chunkstore.PackStats{}, fmt.Errorf("send snapshot %s: %w: its files are not on this host", id, ErrNotFound)
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
	if from := a.lineageBase(si, held); from != "" {
		if bases, release = a.sync.SnapshotBases(ctx, from); bases != nil {
			baseName = storesync.SnapshotSet(from)
		}
	}
	if bases == nil {
		bases, release = a.sync.TemplateBases(ctx, si.Template)
	}
	if bases == nil && a.store != nil {
		// A capture of a sandbox restored here from the store, whose
		// template this host lacks: without it every chunk would go
		// whole (the whole memory image, not what the sandbox wrote).
		release()
		a.sync.StartTemplateFetch(si.Template, si.Spec)
		a.sync.AwaitTemplateJob(ctx, si, "a pack waited for this host to fetch the template to diff it against")
		bases, release = a.sync.TemplateBases(ctx, si.Template)
	}
	defer release()
	st, err := chunkstore.WritePack(ctx, w, files, chunkstore.PackOptions{ChunkSize: a.sync.ChunkSize(), Meta: meta, Bases: bases, BaseName: baseName})
	if err != nil {
		return st, fmt.Errorf("send snapshot %s: %w", id, err)
	}
	a.log.Info("snapshot sent", "snapshot_id", id, "base", cmp.Or(baseName, "template"), "dur_ms", st.Dur.Milliseconds(), "setup_ms", st.SetupDur.Milliseconds(), "bytes", st.Bytes, "chunks_base", st.BaseChunks,
		"chunks_patch", st.PatchChunks, "chunks_whole", st.WholeChunks, "zero_chunks", st.ZeroChunks, "chunks_unread", st.Unread,
		"bytes_read", st.BytesRead, "dirty_bytes", si.Capture.DirtyBytes)
	return st, nil
}

// ReceiveSnapshot reads a pack of snapshot id (SendSnapshot's, from
// another host) from r and keeps it as this host's snapshot id, complete
// or not at all; a create from it then restores as from any snapshot. Its
// FetchedBytes is the length of the pack. A pack made against a template
// the host lacks, or holds another bake of, waits while the host fetches
// the object store's copy (packSeeds). Errors: ErrConflict if the
// host has a snapshot id already; templates.ErrNotFound if the host still
// lacks the sender's copy of the template then, before anything is
// written (the caller sends it another way); ErrCorrupt if the stream is
// cut short or damaged; ErrInvalid if it is not snapshot id's.
func (a *Agent) ReceiveSnapshot(ctx context.Context, id string, r io.Reader) (SnapshotInfo, error) {
	return a.receiveSnapshot(ctx, id, r, nil)
}

// receiveSnapshot is ReceiveSnapshot telling arr (if not nil) what
// arrives as it does: the snapshot's description and where its files are
// once they are made, when its disk is complete, and how the receive
// ended. arr is ended on every return.
func (a *Agent) receiveSnapshot(ctx context.Context, id string, r io.Reader, arr *arrival) (_ SnapshotInfo, err error) {
	if arr != nil {
		defer func() { arr.end(err) }()
	}
	if !host.ValidID(id) {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot: %w: id %q must be lowercase letters and digits", ErrInvalid, id)
	}
	br := bufio.NewReaderSize(r, 1<<20)
	h, err := chunkstore.ReadPackHeader(br)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: %w", id, ErrCorrupt, err)
	}
	var si SnapshotInfo
	if err := json.Unmarshal(h.Meta, &si); err != nil || si.ID != id {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: the pack holds snapshot %q", id, ErrInvalid, si.ID)
	}
	from, err := storesync.BaseOfPack(h)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w", id, err)
	}
	var seeds []chunkstore.Seed
	var release func()
	if from != "" {
		// Diffed against a snapshot this host said it holds.
		var bases map[string]chunkstore.Seed
		bases, release = a.sync.SnapshotBases(ctx, from)
		seeds = storesync.SeedsOf(bases)
	} else {
		seeds, release = a.packSeeds(ctx, h, si)
	}
	defer release()
	t0 := time.Now()
	// One at a time, and never while a delete of it runs (LockSnapshots: as a
	// download from the store).
	defer a.sync.LockSnapshots()()
	dir := a.snapshotDir(id)
	if _, err := os.Stat(dir); err == nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: exists", id, ErrConflict)
	}
	if _, ok := a.sync.Record(id); ok {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: exists (or was deleted) here", id, ErrConflict)
	}
	if err := a.checkSpace(); err != nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w", id, err)
	}
	if h.Base != "" && len(seeds) == 0 {
		if from != "" {
			return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: this host has no usable copy of snapshot %s, the pack's base; send it another way", id, templates.ErrNotFound, from)
		}
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: this host has no usable copy of template %s; send it through the object store", id, templates.ErrNotFound, si.Template)
	}
	tmp := dir + storesync.FetchSuffix
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w", id, classifyIOError(err))
	}
	var filesDone func(int)
	if arr != nil {
		arr.begin(si, tmp)
		disk := slices.IndexFunc(h.Files, func(f chunkstore.PackFile) bool { return f.Name == diskFile })
		filesDone = func(n int) {
			if n > disk {
				arr.diskIn()
			}
		}
	}
	st, err := chunkstore.ReadPackNotify(ctx, br, h, tmp, seeds, filesDone)
	if err == nil {
		if verr := capture.CheckDownloaded(tmp); verr != nil {
			err = fmt.Errorf("%w: %w", ErrCorrupt, verr)
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
		arr.withDir(func(string) error { return os.RemoveAll(tmp) })
		switch {
		case errors.Is(err, chunkstore.ErrPackBase) && from != "":
			return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: this host's copy of snapshot %s is not the sender's: %w", id, templates.ErrNotFound, from, err)
		case errors.Is(err, chunkstore.ErrPackBase):
			// This host's copy changed since packSeeds (or the store
			// holds neither host's): check again for the next pack.
			a.sync.StartTemplateSync(si.Template, false)
			return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: this host's copy of template %s is not the sender's: %w", id, templates.ErrNotFound, si.Template, err)
		case errors.Is(err, chunkstore.ErrPack):
			return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: %w", id, ErrCorrupt, err)
		case ctx.Err() != nil:
			return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w", id, ctx.Err())
		}
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w", id, classifyIOError(err))
	}
	if fp, err := manifest.Fingerprint(dir); err == nil {
		a.mu.Lock()
		a.verified[id] = fp // checked record by record as it came
		a.mu.Unlock()
	}
	a.log.Info("snapshot received", "snapshot_id", id, "transient", si.Transient, "dur_ms", time.Since(t0).Milliseconds(), "bytes", st.Bytes,
		"chunks_base", st.BaseChunks, "chunks_patch", st.PatchChunks, "chunks_whole", st.WholeChunks, "chunks_reflinked", st.Reflinked)
	if !si.Transient {
		a.sync.StartUpload(id) // a snapshot of this host's now: durable as its own
	}
	out, err := a.GetSnapshot(id)
	out.FetchedBytes = st.Bytes
	return out, err
}

// the template it was made against (packSeeds).
const packTemplateWait = 30 * time.Second

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
func (a *Agent) packSeeds(ctx context.Context, h chunkstore.PackHeader, si SnapshotInfo) ([]chunkstore.Seed, func()) {
	seeds, release := a.sync.TemplateSeeds(ctx, si.Template)
	if h.Base == "" || a.store == nil || h.BaseHeld(seeds) {
		return seeds, release
	}
	release()
	if len(seeds) == 0 {
		a.sync.StartTemplateFetch(si.Template, si.Spec)
	} else {
		a.sync.StartTemplateSync(si.Template, false)
	}
	a.sync.AwaitTemplateJob(ctx, si, "a pack waited for this host to fetch its template")
	return a.sync.TemplateSeeds(ctx, si.Template)
}

// ReceiveAndCreate receives a pack of snapshot req.SnapshotID from r, as
// ReceiveSnapshot, and creates sandbox req from it, as Create, starting
// the sandbox's VMM while the pack still arrives: its files are linked
// once the disk is in (the pack's files come in name order: the disk,
// then the memory image and the device state), and the machine is loaded
// once all of it is, its records checked. The VMM's start, about a
// hundred milliseconds under TCG, so overlaps the memory's transfer;
// nothing of the guest runs before its memory is complete.
//
// It returns the sandbox and the snapshot kept. A pack that is not
// received (ReceiveSnapshot's errors) returns that error and a zero
// SnapshotInfo, and no sandbox remains; one that is received keeps the
// snapshot (its SnapshotInfo) whether the create succeeds or fails (its
// error: Create's).
func (a *Agent) ReceiveAndCreate(ctx context.Context, req CreateRequest, r io.Reader) (Info, SnapshotInfo, error) {
	if req.SnapshotID == "" {
		return Info{}, SnapshotInfo{}, fmt.Errorf("create sandbox: %w: a snapshot id is required", ErrInvalid)
	}
	if err := checkCreate(&req); err != nil {
		return Info{}, SnapshotInfo{}, err
	}
	arr := newArrival()
	type received struct {
		si  SnapshotInfo
		err error
	}
	recv := make(chan received, 1)
	go func() {
		si, err := a.receiveSnapshot(ctx, req.SnapshotID, r, arr)
		recv <- received{si, err}
	}()
	select {
	case <-arr.begun:
	case rv := <-recv: // refused before its files were made
		return Info{}, SnapshotInfo{}, rv.err
	}
	info, cerr := a.createFrom(ctx, req, image{Spec: arr.si.Spec, Template: arr.si.Template, lineage: lineageOf(arr.si), arrival: arr}, chunkstore.DownloadStats{})
	rv := <-recv
	if rv.err != nil {
		return Info{}, SnapshotInfo{}, rv.err // the create, waiting for it, failed too
	}
	return info, rv.si, cerr
}

// arrival is a snapshot being received (receiveSnapshot) for a create
// that starts from it before all of it is in (ReceiveAndCreate). Its
// methods are safe for concurrent use; those of a nil arrival do nothing.
type arrival struct {
	begun chan struct{} // closed by begin
	disk  chan struct{} // closed by diskIn
	ended chan struct{} // closed by end; err then says how
	si    SnapshotInfo  // set by begin: read it once begun is closed

	mu   sync.Mutex
	dir  string // where its files are now
	err  error
	once sync.Once // of diskIn
}

func newArrival() *arrival {
	return &arrival{begun: make(chan struct{}), disk: make(chan struct{}), ended: make(chan struct{})}
}

// begin says the receive will write the snapshot si into dir.
func (ar *arrival) begin(si SnapshotInfo, dir string) {
	ar.si = si
	ar.mu.Lock()
	ar.dir = dir
	ar.mu.Unlock()
	close(ar.begun)
}

// diskIn says the disk is complete (its records read and checked).
func (ar *arrival) diskIn() { ar.once.Do(func() { close(ar.disk) }) }

// move runs fn, which moves the files to dir, with no withDir meanwhile;
// if it succeeds they are in dir from then on. A nil arrival just runs fn.
func (ar *arrival) move(dir string, fn func() error) error {
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
func (ar *arrival) end(err error) {
	ar.mu.Lock()
	ar.err = err
	ar.mu.Unlock()
	close(ar.ended)
}

// withDir runs fn with the directory the files are in, which does not
// change meanwhile (the receive moves it with move).
func (ar *arrival) withDir(fn func(dir string) error) error {
	if ar == nil {
		return fn("")
	}
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return fn(ar.dir)
}

// waitDisk waits until the disk is complete (or the receive ended: its
// error) or ctx ends.
func (ar *arrival) waitDisk(ctx context.Context) error {
	select {
	case <-ar.disk:
		return nil
	case <-ar.ended:
		return ar.result()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait waits until the receive ends and returns its error, or ctx's.
func (ar *arrival) wait(ctx context.Context) error {
	select {
	case <-ar.ended:
		return ar.result()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ar *arrival) result() error {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.err
}
