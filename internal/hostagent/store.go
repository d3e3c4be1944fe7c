package hostagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Snapshots, paused sandboxes and templates in the object store
// (Config.Store; docs/storage.md) are package storesync's: this file is
// the agent's side of it, what a snapshot's description says of its copy
// in the store, and the start and stop of the background jobs.

// newSync makes the agent's store sync, with what it needs of the agent.
func (a *Agent) newSync() *storesync.Sync {
	cfg := storesync.Config{
		Store:      a.store,
		Templates:  a.templates,
		Dir:        a.vol.Dir,
		Retry:      a.cfg.StoreRetry,
		GiveUp:     func(err error) bool { return errors.Is(err, errMoved) },
		Log:        a.log,
		Snapshot:   a.GetSnapshot,
		CheckSpace: a.checkSpace,
		VerifySnapshot: func(id string) error {
			return a.verifySnapshot(SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: id}})
		},
		Verified: a.setVerified,
	}
	if a.cfg.Lazy != nil {
		cfg.Lazy = a.lazy
	}
	return storesync.New(cfg)
}

// setVerified records that snapshot id's files, of fingerprint fp, just
// passed their checks (verifySnapshot need not read them again).
func (a *Agent) setVerified(id, fp string) {
	a.mu.Lock()
	a.verified[id] = fp
	a.mu.Unlock()
}

// templateRemote is the store sync as the templates' Remote, made before
// it (the sync needs the template store).
type templateRemote struct{ a *Agent }

var _ template.Remote = templateRemote{}

func (r templateRemote) Fetch(ctx context.Context, key string, accept func(templates.Meta) bool, dir string) (templates.Meta, *template.ChunkIndex, error) {
	return r.a.sync.Fetch(ctx, key, accept, dir)
}

func (r templateRemote) Baked(t *template.Template) { r.a.sync.Baked(t) }

// storeState fills in where si is kept.
func (a *Agent) storeState(si *SnapshotInfo) {
	if a.store == nil {
		si.Stored = host.StoredLocal
		return
	}
	if r, ok := a.sync.Record(si.ID); ok && r.Durable {
		si.Stored = host.StoredDurable
		si.UploadedBytes = r.Upload.BytesUploaded
		if r.Fetch != nil {
			si.FetchedBytes = r.Fetch.BytesFetched
		}
		return
	}
	si.Stored = host.StoredUploading
	si.StoreError = a.storeError(storesync.SnapshotSet(si.ID))
}

// storeError is why the last attempt of the job of set key failed, as
// users see it ("" if it did not).
func (a *Agent) storeError(key string) string {
	if err := a.sync.LastError(key); err != nil {
		return storeErrorText(err)
	}
	return ""
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
			a.sync.StartUpload(id) // its upload waits for a waiter (SnapshotTransient)
		}
		j := a.sync.Job(storesync.SnapshotSet(id))
		if j == nil {
			// No upload runs: the agent is closing, or the upload gave
			// up (errMoved), or it has just ended: waiting changes nothing.
			return a.GetSnapshot(id)
		}
		select {
		case <-j.Done():
		case <-t.C:
			return a.GetSnapshot(id)
		case <-ctx.Done():
			return SnapshotInfo{}, fmt.Errorf("wait for snapshot %s to be stored: %w", id, ctx.Err())
		}
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

// adoptSnapshot makes snapshot id, which this host does not know, one of
// this host's (storesync.Sync.AdoptSnapshot) and describes it.
func (a *Agent) adoptSnapshot(ctx context.Context, id string) (SnapshotInfo, chunkstore.DownloadStats, error) {
	st, err := a.sync.AdoptSnapshot(ctx, id)
	if err != nil {
		return SnapshotInfo{}, st, err
	}
	si, err := a.GetSnapshot(id)
	return si, st, err
}

// resumeStore, at start, finishes the deletes and uploads an earlier run
// left: tombstoned snapshots are removed locally and from the store, and
// local snapshots not yet durable are uploaded; the same for paused
// sandboxes (resumePausedStore).
func (a *Agent) resumeStore() {
	if a.store == nil {
		return
	}
	recs, _ := os.ReadDir(filepath.Join(a.vol.Dir, storesync.StoredDir))
	for _, e := range recs {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !host.ValidID(id) {
			continue
		}
		if r, ok := a.sync.Record(id); ok && r.Deleted {
			os.RemoveAll(a.snapshotDir(id)) // a delete a crash interrupted
			a.sync.StartDelete(id)
		}
	}
	for _, si := range a.Snapshots() {
		if si.Stored == host.StoredUploading {
			a.sync.StartUpload(si.ID)
		}
	}
	a.resumePausedStore()
	a.sync.SyncTemplates()
}
