package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Snapshots in the object store (Config.Store; docs/storage.md).
//
// A snapshot is taken on this host's disk as always and serves from there;
// then a background upload stores its sealed files as the chunkstore set
// snapshots/<id>. When the upload's manifest is written, the agent writes
// the snapshot's record, STORE/stored/<id>.json: the snapshot is durable,
// and the record (which holds its metadata) keeps it known even if its
// directory is lost; a create from it then downloads it again. A failed
// upload is retried with backoff until it succeeds or the snapshot is
// deleted; a snapshot without a durable record when the agent starts
// (Recover) is uploaded again, and chunks the interrupted upload stored
// are not sent twice (chunkstore skips chunks already in the store). The
// set's manifest carries the snapshot's metadata (its SnapshotInfo, as
// Meta): a create on a host that never saw the snapshot finds it there,
// downloads it and records it as its own (adoptSnapshot).
//
// Deleting a snapshot writes a tombstone record first, then removes the
// local files, then (in the background, retried) the manifest in the
// store, then the record, then runs the store's garbage collection. A
// tombstone found at start finishes that delete.
//
// Locking: upMu guards uploads and deletes (the background jobs) and
// storeErrs; it is never held across I/O on the object store. fetchMu is
// held by a download from the store (one at a time) and by a delete's
// tombstone and removal of the local files, so that a delete never races
// a download that would put the files back.

// storedDir holds the records of snapshots in the object store.
const storedDir = "stored"

// fetchSuffix marks a snapshot directory being downloaded from the store.
const fetchSuffix = ".fetch"

// storeName is a snapshot's set name in the chunkstore.
func storeName(id string) string { return "snapshots/" + id }

// storeRecord is STORE/stored/<id>.json.
type storeRecord struct {
	// Snapshot is the snapshot's metadata (its snapshot.json).
	Snapshot SnapshotInfo `json:"snapshot"`
	// Durable: the store holds the snapshot's manifest and chunks.
	Durable bool `json:"durable"`
	// Deleted: the snapshot was deleted; its manifest in the store is
	// still to be removed.
	Deleted    bool             `json:"deleted,omitempty"`
	UploadedAt time.Time        `json:"uploaded_at,omitzero"`
	Upload     chunkstore.Stats `json:"upload"`
	// Fetch is what the download of a snapshot this host adopted (taken
	// on another host) did.
	Fetch *chunkstore.DownloadStats `json:"fetch,omitempty"`
}

// job is one background upload or store delete of a set.
type job struct {
	kind   string // jobUpload, jobDelete, jobFetch or jobGC
	cancel context.CancelFunc
	done   chan struct{}
	prev   *job // the job of the same set it was chained after (nil: none)
}

// The kinds of job.
const (
	jobUpload = "upload"
	jobDelete = "delete"
	jobFetch  = "fetch" // of a template (startTemplateFetch)
	jobGC     = "gc"    // of key gcKey
)

// gcKey is the job key of the store's garbage collection (not a set's).
const gcKey = "gc"

// startJobLocked runs f in the background as the job of the set key,
// tried again (retry) until it succeeds or is cancelled. If a job of key
// exists: with chain, the new one starts once it has ended (so that the
// uploads and deletes of one set never overlap); without, startJobLocked
// does nothing. Nothing starts while the agent closes. Called with upMu
// held.
func (a *Agent) startJobLocked(key, kind, what string, chain bool, f func(context.Context) error) {
	prev := a.jobs[key]
	if a.bgCtx.Err() != nil || (prev != nil && !chain) {
		return
	}
	ctx, cancel := context.WithCancel(a.bgCtx)
	j := &job{kind: kind, cancel: cancel, done: make(chan struct{}), prev: prev}
	// Every job before this one, not only the last: one cancelled while it
	// waited ends before those it waited for.
	var before []chan struct{}
	for p := prev; p != nil; p = p.prev {
		before = append(before, p.done)
	}
	a.jobs[key] = j
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		defer close(j.done)
		defer cancel()
		for _, done := range before {
			select {
			case <-done:
			case <-ctx.Done():
			}
		}
		if ctx.Err() == nil {
			a.retry(ctx, key, what, f)
		}
		a.upMu.Lock()
		if a.jobs[key] == j {
			delete(a.jobs, key)
			for p := prev; p != nil; p = p.prev {
				if !closed(p.done) {
					a.jobs[key] = p // cancelled while waiting: one before still runs
					break
				}
			}
		}
		j.prev = nil // all before it have ended, or are reached from a.jobs[key]
		a.upMu.Unlock()
	}()
}

// cancelJob cancels the job of key if it is of kind and waits for it to
// end; it returns whether there was one.
func (a *Agent) cancelJob(key, kind string) bool {
	a.upMu.Lock()
	j := a.jobs[key]
	if j == nil || j.kind != kind {
		a.upMu.Unlock()
		return false
	}
	j.cancel()
	a.upMu.Unlock()
	<-j.done
	return true
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (a *Agent) recordPath(id string) string {
	return filepath.Join(a.vol.Dir, storedDir, id+".json")
}

// storedRecord reads a snapshot's record; false if there is none (or it
// cannot be read: the snapshot is then uploaded again).
func (a *Agent) storedRecord(id string) (storeRecord, bool) {
	var r storeRecord
	b, err := os.ReadFile(a.recordPath(id))
	if err != nil || json.Unmarshal(b, &r) != nil {
		return storeRecord{}, false
	}
	return r, true
}

// storeState fills in where si is kept.
func (a *Agent) storeState(si *SnapshotInfo) {
	if a.store == nil {
		si.Stored = host.StoredLocal
		return
	}
	if r, ok := a.storedRecord(si.ID); ok && r.Durable {
		si.Stored = host.StoredDurable
		si.UploadedBytes = r.Upload.BytesUploaded
		if r.Fetch != nil {
			si.FetchedBytes = r.Fetch.BytesFetched
		}
		return
	}
	si.Stored = host.StoredUploading
	si.StoreError = a.storeError(storeName(si.ID))
}

// deleted reports whether snapshot id has a tombstone.
func (a *Agent) deleted(id string) bool {
	r, ok := a.storedRecord(id)
	return ok && r.Deleted
}

// storeError is why the last attempt of the job of set key failed ("" if
// it did not).
func (a *Agent) storeError(key string) string {
	a.upMu.Lock()
	defer a.upMu.Unlock()
	return a.storeErrs[key]
}

// startUpload uploads snapshot id in the background unless it is being
// uploaded already, is deleted or the agent has no store (or is closing).
func (a *Agent) startUpload(id string) {
	if a.store == nil {
		return
	}
	a.upMu.Lock()
	defer a.upMu.Unlock()
	if a.deleted(id) {
		return
	}
	a.startJobLocked(storeName(id), jobUpload, "upload snapshot", false, func(ctx context.Context) error { return a.uploadSnapshot(ctx, id) })
}

// AwaitStored returns snapshot id as GetSnapshot describes it once it is
// durable in the object store (or kept only here: the agent has no
// store), or once wait has passed (still uploading, with StoreError);
// ctx ending ends it with ctx's error. It waits on the upload job, not by
// polling.
func (a *Agent) AwaitStored(ctx context.Context, id string, wait time.Duration) (SnapshotInfo, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		si, err := a.GetSnapshot(id)
		if err != nil || si.Stored != host.StoredUploading {
			return si, err
		}
		if si.Transient {
			a.startUpload(id) // its upload waits for a waiter (SnapshotTransient)
		}
		a.upMu.Lock()
		j := a.jobs[storeName(id)]
		a.upMu.Unlock()
		if j == nil {
			// No upload runs: the agent is closing, or the upload gave
			// up (errMoved), or it has just ended: waiting changes nothing.
			return a.GetSnapshot(id)
		}
		select {
		case <-j.done:
		case <-t.C:
			return a.GetSnapshot(id)
		case <-ctx.Done():
			return SnapshotInfo{}, fmt.Errorf("wait for snapshot %s to be stored: %w", id, ctx.Err())
		}
	}
}

// retry runs f until it succeeds or ctx ends, waiting between attempts
// (StoreRetry, doubling to 32 times that). The last failure is what
// SnapshotInfo.StoreError and Info.StoreError show (storeErrs[key]).
func (a *Agent) retry(ctx context.Context, key, what string, f func(context.Context) error) {
	wait := a.cfg.StoreRetry
	for {
		err := f(ctx)
		if ctx.Err() != nil {
			return
		}
		a.upMu.Lock()
		if err == nil {
			delete(a.storeErrs, key)
		} else {
			a.storeErrs[key] = storeErrorText(err)
		}
		a.upMu.Unlock()
		if err == nil {
			return
		}
		if errors.Is(err, errMoved) { // trying again cannot help
			a.log.Warn(what+" given up", "set", key, "err", err)
			return
		}
		if errors.Is(err, chunkstore.ErrBusy) { // another's upload: nothing is wrong
			a.log.Info(what+" put off; will retry", "retry_in_ms", wait.Milliseconds(), "reason", err)
		} else {
			a.log.Warn(what+" failed; will retry", "set", key, "retry_in_ms", wait.Milliseconds(), "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, 32*a.cfg.StoreRetry)
	}
}

// storeErrorText is an upload error as users see it: the object store's
// class, not the paths and addresses in the chain.
func storeErrorText(err error) string {
	switch {
	case errors.Is(err, objstore.ErrUnavailable):
		return "the object store is unavailable"
	case errors.Is(err, host.ErrNoSpace):
		return "out of disk space"
	case errors.Is(err, errMoved):
		return errMoved.Error()
	}
	return "upload failed (see the host agent's log)"
}

// uploadSnapshot stores snapshot id's files and records it durable.
func (a *Agent) uploadSnapshot(ctx context.Context, id string) error {
	if r, ok := a.storedRecord(id); ok && r.Durable {
		return nil
	}
	dir := a.snapshotDir(id)
	si, err := a.GetSnapshot(id)
	if err != nil {
		return err
	}
	files := map[string]string{}
	for _, f := range []string{memFile, stateFile, diskFile, snapshotMeta, manifest.Name} {
		p := filepath.Join(dir, f)
		if _, err := os.Stat(p); err == nil {
			files[f] = p
		} else if f != manifest.Name { // snapshots older than checksums have none
			return fmt.Errorf("upload snapshot %s: %w", id, err)
		}
	}
	si.Stored, si.StoreError, si.UploadedBytes, si.FetchedBytes = "", "", 0, 0
	meta, err := json.Marshal(si)
	if err != nil {
		return err
	}
	// Its chunks that its template shares are in the store with the
	// template (or go there now): see templates.go.
	a.startTemplateSync(si.Template, false)
	t0 := time.Now()
	bases, release := a.templateBases(ctx, si.Template)
	tUpload := time.Now()
	_, st, err := a.store.UploadWith(ctx, storeName(id), files, chunkstore.UploadOptions{Meta: meta, Bases: bases, Known: []string{templateName(si.Template)}}, nil)
	release()
	if err != nil {
		return err
	}
	rec := storeRecord{Snapshot: si, Durable: true, UploadedAt: time.Now().UTC(), Upload: st}
	if err := writeJSON(a.recordPath(id), rec, true); err != nil {
		return fmt.Errorf("upload snapshot %s: record: %w", id, classifyIOError(err))
	}
	a.log.Info("snapshot durable in the object store", "snapshot_id", id, "dur_ms", time.Since(t0).Milliseconds(),
		"chunks", st.ChunksTotal, "chunks_uploaded", st.ChunksUploaded, "chunks_delta", st.ChunksDelta, "chunks_shared", st.ChunksShared, "chunks_unread", st.ChunksUnread,
		"zero_chunks", st.ZeroChunks, "bytes_uploaded", st.BytesUploaded, "dirty_bytes", si.Capture.DirtyBytes,
		"bases_ms", tUpload.Sub(t0).Milliseconds(), "setup_ms", st.SetupDur.Milliseconds(), "chunks_ms", st.ChunksDur.Milliseconds(), "manifest_ms", st.ManifestDur.Milliseconds())
	return nil
}

// fetchSnapshot downloads snapshot id, durable in the store, into its
// directory if that is missing, and checks it against its checksums. The
// directory appears complete or not at all. Chunks this host's copy of
// the snapshot's template holds are taken from there (templates.go). m is
// the set's manifest if the caller read it (nil: read here). It returns
// what the download did (zero if the directory was there).
func (a *Agent) fetchSnapshot(ctx context.Context, id string, m *chunkstore.Manifest) (chunkstore.DownloadStats, error) {
	a.fetchMu.Lock()
	defer a.fetchMu.Unlock()
	var st chunkstore.DownloadStats
	dir := a.snapshotDir(id)
	if _, err := os.Stat(dir); err == nil {
		return st, nil // fetched by a create before this one
	}
	if err := a.checkSpace(); err != nil {
		return st, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	tmp := dir + fetchSuffix
	os.RemoveAll(tmp)
	t0 := time.Now()
	var err error
	if m == nil {
		m, err = a.store.Manifest(ctx, storeName(id))
	}
	if err == nil {
		var si SnapshotInfo
		json.Unmarshal(m.Meta, &si) // no metadata: no template to take chunks from
		seeds, release := a.templateSeeds(ctx, si.Template)
		hasTemplate := len(seeds) > 0
		// And the snapshot it derives from, if held here (lineage.go).
		seeds, release = a.lineageSeeds(ctx, si.Lineage, seeds, release)
		if a.cfg.Lazy != nil && a.lazyWorth(m, seeds) { // lazy restore: lazy.go
			st, err = a.downloadLazy(ctx, m, tmp, seeds)
		} else {
			st, err = a.store.DownloadSeeded(ctx, m, tmp, seeds)
			if err == nil && !hasTemplate {
				a.startTemplateFetch(si.Template, si.Spec) // templates.go
			}
		}
		release()
	}
	tDownload := time.Since(t0)
	if err == nil {
		if verr := capture.CheckDownloaded(tmp); verr != nil {
			err = fmt.Errorf("%w: %w", ErrCorrupt, verr)
		}
	}
	if err == nil {
		err = manifest.Rename(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		a.log.Error("fetch snapshot from the object store", "snapshot_id", id, "err", err)
		return st, fetchFailed(ctx, "snapshot", id, err, fetchWhy{
			unavailable: fmt.Sprintf("snapshot %s is not on this host and the object store that keeps it cannot be reached; retry when it is back", id),
			notFound:    "neither this host nor the object store has its files",
			corrupt:     "its copy in the object store does not match its checksums",
		})
	}
	if fp, err := manifest.Fingerprint(dir); err == nil {
		a.mu.Lock()
		a.verified[id] = fp // just verified
		a.mu.Unlock()
	}
	a.log.Info("snapshot fetched from the object store", "snapshot_id", id, "dur_ms", time.Since(t0).Milliseconds(),
		"download_ms", tDownload.Milliseconds(), "chunks_fetched", st.ChunksFetched, "chunks_delta", st.ChunksDelta, "bytes_fetched", st.BytesFetched,
		"chunks_local", st.ChunksSeeded, "bytes_local", st.BytesSeeded, "chunks_reflinked", st.ChunksCloned)
	return st, nil
}

// adoptSnapshot makes snapshot id, which this host does not know (taken
// on another host sharing the object store), one of this host's: it reads
// the set's manifest, downloads and checks its files (fetchSnapshot) and
// records it durable, as if this host had taken and uploaded it. From then
// on it is listed, restored and deleted here like the host's own. A
// snapshot deleted here, or not in the store, is ErrNotFound; a store that
// cannot be reached is host.ErrUnavailable.
func (a *Agent) adoptSnapshot(ctx context.Context, id string) (SnapshotInfo, chunkstore.DownloadStats, error) {
	var st chunkstore.DownloadStats
	if a.store == nil || !host.ValidID(id) || a.deleted(id) {
		return SnapshotInfo{}, st, fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	m, err := a.store.Manifest(ctx, storeName(id))
	if err != nil {
		return SnapshotInfo{}, st, a.storeLookupError(ctx, "snapshot", id, err)
	}
	var si SnapshotInfo
	if len(m.Meta) > 0 {
		if err := json.Unmarshal(m.Meta, &si); err != nil || si.ID != id {
			a.log.Error("snapshot's metadata in the object store is unreadable", "snapshot_id", id, "err", err)
			return SnapshotInfo{}, st, fmt.Errorf("snapshot %s: %w: its metadata in the object store is unreadable", id, ErrCorrupt)
		}
	}
	if st, err = a.fetchSnapshot(ctx, id, m); err != nil {
		return SnapshotInfo{}, st, err
	}
	if len(m.Meta) == 0 {
		// Uploaded before manifests carried metadata: its snapshot.json
		// (checked with the rest) says the same.
		b, err := os.ReadFile(filepath.Join(a.snapshotDir(id), snapshotMeta))
		if err == nil {
			err = json.Unmarshal(b, &si)
		}
		if err != nil {
			return SnapshotInfo{}, st, fmt.Errorf("snapshot %s: %w: unreadable metadata", id, ErrCorrupt)
		}
	}
	si.Stored, si.StoreError, si.UploadedBytes, si.FetchedBytes = "", "", 0, 0
	if err := writeJSON(a.recordPath(id), storeRecord{Snapshot: si, Durable: true, Fetch: &st}, true); err != nil {
		return SnapshotInfo{}, st, fmt.Errorf("adopt snapshot %s: record: %w", id, classifyIOError(err))
	}
	a.log.Info("snapshot adopted from the object store", "snapshot_id", id, "sandbox_id", si.SandboxID)
	si, err = a.GetSnapshot(id)
	return si, st, err
}

// storeLookupError classifies a failure to read the manifest of a set
// of what (snapshot, paused sandbox) id in the object store.
func (a *Agent) storeLookupError(ctx context.Context, what, id string, err error) error {
	switch {
	case errors.Is(err, objstore.ErrNotFound):
		return fmt.Errorf("%s %s: %w", what, id, ErrNotFound)
	case errors.Is(err, objstore.ErrUnavailable):
		a.log.Error("look up in the object store", "what", what, "id", id, "err", err)
		return &classed{class: host.ErrUnavailable, msg: fmt.Sprintf("%s %s is not on this host and the object store that may keep it cannot be reached; retry when it is back", what, id)}
	case ctx.Err() != nil:
		return fmt.Errorf("look up %s %s: %w", what, id, ctx.Err())
	}
	a.log.Error("look up in the object store", "what", what, "id", id, "err", err)
	return fmt.Errorf("%s %s: %w: its record in the object store is unreadable", what, id, ErrCorrupt)
}

// forgetInStore marks snapshot id deleted (a tombstone), after stopping
// its upload. The caller then removes the local files and calls
// startStoreDelete.
func (a *Agent) forgetInStore(id string, si SnapshotInfo) error {
	a.upMu.Lock()
	j := a.jobs[storeName(id)]
	if j != nil {
		j.cancel()
	}
	rec := storeRecord{Snapshot: si, Deleted: true}
	err := writeJSON(a.recordPath(id), rec, true)
	delete(a.storeErrs, storeName(id))
	a.upMu.Unlock()
	if j != nil {
		<-j.done
	}
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, classifyIOError(err))
	}
	return nil
}

// startStoreDelete removes snapshot id's manifest from the store in the
// background (retried until it succeeds), then its tombstone, then
// collects garbage.
func (a *Agent) startStoreDelete(id string) {
	a.upMu.Lock()
	defer a.upMu.Unlock()
	a.startJobLocked(storeName(id), jobDelete, "delete snapshot from the object store", false, func(ctx context.Context) error {
		if err := a.lazyFetchAll(ctx, storeName(id)); err != nil { // lazy.go
			return err
		}
		if err := a.store.Delete(ctx, storeName(id)); err != nil && !errors.Is(err, objstore.ErrNotFound) {
			return err
		}
		if err := os.Remove(a.recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		a.log.Info("snapshot deleted from the object store", "snapshot_id", id)
		a.startGC()
		return nil
	})
}

// startGC asks for a collection of the store's garbage, the chunks no
// manifest references, in the background: one runs at a time, tried
// again (retry) while an upload of this host or another holds it off
// (chunkstore.ErrBusy) or the store is down. A request made while one
// runs is served by the next, unless one that began after it succeeded.
func (a *Agent) startGC() {
	a.upMu.Lock()
	defer a.upMu.Unlock()
	a.gcAsked++
	asked := a.gcAsked
	a.startJobLocked(gcKey, jobGC, "object store garbage collection", true, func(ctx context.Context) error {
		a.upMu.Lock()
		served, began := a.gcDone >= asked, a.gcAsked
		a.upMu.Unlock()
		if served {
			return nil
		}
		n, err := a.store.GC(ctx)
		if err != nil {
			return err
		}
		a.upMu.Lock()
		a.gcDone = max(a.gcDone, began)
		a.upMu.Unlock()
		if n > 0 {
			a.log.Info("object store garbage collection", "chunks_removed", n)
		}
		return nil
	})
}

// resumeStore, at start, finishes the deletes and uploads an earlier run
// left: tombstoned snapshots are removed locally and from the store, and
// local snapshots not yet durable are uploaded; the same for paused
// sandboxes (resumePausedStore).
func (a *Agent) resumeStore() {
	if a.store == nil {
		return
	}
	recs, _ := os.ReadDir(filepath.Join(a.vol.Dir, storedDir))
	for _, e := range recs {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !host.ValidID(id) {
			continue
		}
		if r, ok := a.storedRecord(id); ok && r.Deleted {
			os.RemoveAll(a.snapshotDir(id)) // a delete a crash interrupted
			a.startStoreDelete(id)
		}
	}
	for _, si := range a.Snapshots() {
		if si.Stored == host.StoredUploading {
			a.startUpload(si.ID)
		}
	}
	a.resumePausedStore()
	a.syncTemplates()
}

// stopBackground cancels the uploads and store deletes and waits for them
// to end (they resume at the next start). Idempotent.
func (a *Agent) stopBackground() {
	a.upMu.Lock()
	a.bgCancel()
	a.upMu.Unlock()
	a.bg.Wait()
}

// storeJobs is how the agent's background store work is kept.
type storeJobs struct {
	upMu      sync.Mutex
	jobs      map[string]*job
	storeErrs map[string]string
	// gcAsked counts the requests for a garbage collection (startGC);
	// gcDone is the count when the last one that succeeded began.
	gcAsked, gcDone int
	bg              sync.WaitGroup
	bgCtx           context.Context
	bgCancel        context.CancelFunc
	fetchMu         sync.Mutex
	// adoptMu is held by a resume downloading a paused sandbox from the
	// store (adoptPaused), one at a time.
	adoptMu sync.Mutex
}

// classed is an error of class whose text is msg alone, where the class's
// own text would mislead (host.ErrUnavailable reads "host agent
// unavailable").
// fetchWhy is what users are told when a fetch from the object store
// fails: the whole message when the store cannot be reached, the detail
// after the class otherwise.
type fetchWhy struct{ unavailable, notFound, corrupt string }

// fetchFailed classifies err, the failure of fetching the set of what
// (a "snapshot", a "sandbox") id from the object store.
func fetchFailed(ctx context.Context, what, id string, err error, why fetchWhy) error {
	switch {
	case errors.Is(err, objstore.ErrUnavailable):
		return &classed{class: host.ErrUnavailable, msg: why.unavailable}
	case errors.Is(err, objstore.ErrNotFound):
		return fmt.Errorf("%s %s: %w: %s", what, id, ErrNotFound, why.notFound)
	case errors.Is(err, ErrCorrupt), errors.Is(err, manifest.ErrCorrupt):
		return fmt.Errorf("%s %s: %w: %s", what, id, ErrCorrupt, why.corrupt)
	case ctx.Err() != nil:
		return fmt.Errorf("fetch %s %s: %w", what, id, ctx.Err())
	}
	return fmt.Errorf("fetch %s %s: %w", what, id, classifyIOError(err))
}

type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }
