package storesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Snapshots in the object store (docs/storage.md).
//
// A snapshot is taken on this host's disk as always and serves from there;
// then a background upload stores its sealed files as the chunkstore set
// snapshots/<id>. When the upload's manifest is written, the snapshot's
// record, STORE/stored/<id>.json, is written: the snapshot is durable,
// and the record (which holds its metadata) keeps it known even if its
// directory is lost; a create from it then downloads it again. A failed
// upload is retried with backoff until it succeeds or the snapshot is
// deleted; a snapshot without a durable record when the agent starts is
// uploaded again, and chunks the interrupted upload stored are not sent
// twice (chunkstore skips chunks already in the store). The set's
// manifest carries the snapshot's metadata (its capture.Info, as Meta): a
// create on a host that never saw the snapshot finds it there, downloads
// it and records it as its own (AdoptSnapshot).
//
// Deleting a snapshot writes a tombstone record first (Forget), then the
// agent removes the local files, then (in the background, retried,
// StartDelete) the manifest in the store goes, then the record, then the
// store's garbage collection runs. A tombstone found at start finishes
// that delete.

// StartUpload uploads snapshot id in the background unless it is being
// uploaded already, is deleted or there is no store (or Stop was called).
func (s *Sync) StartUpload(id string) {
	if s.cfg.Store == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Deleted(id) {
		return
	}
	s.StartLocked(SnapshotSet(id), KindUpload, "upload snapshot", false, func(ctx context.Context) error { return s.uploadSnapshot(ctx, id) })
}

// uploadSnapshot stores snapshot id's files and records it durable.
func (s *Sync) uploadSnapshot(ctx context.Context, id string) error {
	if r, ok := s.Record(id); ok && r.Durable {
		return nil
	}
	dir := s.SnapshotDir(id)
	si, err := s.cfg.Snapshot(id)
	if err != nil {
		return err
	}
	files := map[string]string{}
	for _, f := range []string{capture.MemFile, capture.StateFile, capture.DiskFile, capture.MetaFile, manifest.Name} {
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
	// template (or go there now): StartTemplateSync.
	s.StartTemplateSync(si.Template, false)
	t0 := time.Now()
	bases, release := s.TemplateBases(ctx, si.Template)
	tUpload := time.Now()
	_, st, err := s.cfg.Store.UploadWith(ctx, SnapshotSet(id), files, chunkstore.UploadOptions{Meta: meta, Bases: bases, Known: []string{TemplateSet(si.Template)}}, nil)
	release()
	if err != nil {
		return err
	}
	rec := Record{Snapshot: si, Durable: true, UploadedAt: time.Now().UTC(), Upload: st}
	if err := s.writeRecord(id, rec); err != nil {
		return fmt.Errorf("upload snapshot %s: record: %w", id, classifyIO(err))
	}
	s.log.Info("snapshot durable in the object store", "snapshot_id", id, "dur_ms", time.Since(t0).Milliseconds(),
		"chunks", st.ChunksTotal, "chunks_uploaded", st.ChunksUploaded, "chunks_delta", st.ChunksDelta, "chunks_shared", st.ChunksShared, "chunks_unread", st.ChunksUnread,
		"zero_chunks", st.ZeroChunks, "bytes_uploaded", st.BytesUploaded, "dirty_bytes", si.Capture.DirtyBytes,
		"bases_ms", tUpload.Sub(t0).Milliseconds(), "setup_ms", st.SetupDur.Milliseconds(), "chunks_ms", st.ChunksDur.Milliseconds(), "manifest_ms", st.ManifestDur.Milliseconds())
	return nil
}

// FetchSnapshot downloads snapshot id, durable in the store, into its
// directory if that is missing, and checks it against its checksums. The
// directory appears complete or not at all. Chunks this host's copy of
// the snapshot's template holds are taken from there (templates.go), and
// so are those of the snapshot it derives from if held here (lineage.go).
// m is the set's manifest if the caller read it (nil: read here). It
// returns what the download did (zero if the directory was there).
func (s *Sync) FetchSnapshot(ctx context.Context, id string, m *chunkstore.Manifest) (chunkstore.DownloadStats, error) {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	var st chunkstore.DownloadStats
	dir := s.SnapshotDir(id)
	if _, err := os.Stat(dir); err == nil {
		return st, nil // fetched by a create before this one
	}
	if err := s.cfg.CheckSpace(); err != nil {
		return st, fmt.Errorf("fetch snapshot %s: %w", id, err)
	}
	tmp := dir + FetchSuffix
	os.RemoveAll(tmp)
	t0 := time.Now()
	var err error
	if m == nil {
		m, err = s.cfg.Store.Manifest(ctx, SnapshotSet(id))
	}
	if err == nil {
		var si capture.Info
		json.Unmarshal(m.Meta, &si) // no metadata: no template to take chunks from
		st, err = s.Download(ctx, m, tmp, si.Template, si.Lineage, si.Spec)
	}
	tDownload := time.Since(t0)
	if err == nil {
		if verr := capture.CheckDownloaded(tmp); verr != nil {
			err = fmt.Errorf("%w: %w", host.ErrCorrupt, verr)
		}
	}
	if err == nil {
		err = manifest.Rename(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		s.log.Error("fetch snapshot from the object store", "snapshot_id", id, "err", err)
		return st, FetchFailed(ctx, "snapshot", id, err, FetchWhy{
			Unavailable: fmt.Sprintf("snapshot %s is not on this host and the object store that keeps it cannot be reached; retry when it is back", id),
			NotFound:    "neither this host nor the object store has its files",
			Corrupt:     "its copy in the object store does not match its checksums",
		})
	}
	if fp, err := manifest.Fingerprint(dir); err == nil {
		s.cfg.Verified(id, fp) // just verified
	}
	s.log.Info("snapshot fetched from the object store", "snapshot_id", id, "dur_ms", time.Since(t0).Milliseconds(),
		"download_ms", tDownload.Milliseconds(), "chunks_fetched", st.ChunksFetched, "chunks_delta", st.ChunksDelta, "bytes_fetched", st.BytesFetched,
		"chunks_local", st.ChunksSeeded, "bytes_local", st.BytesSeeded, "chunks_reflinked", st.ChunksCloned)
	return st, nil
}

// AdoptSnapshot makes snapshot id, which this host does not know (taken
// on another host sharing the object store), one of this host's: it reads
// the set's manifest, downloads and checks its files (FetchSnapshot) and
// records it durable, as if this host had taken and uploaded it. From then
// on it is listed, restored and deleted here like the host's own. A
// snapshot deleted here, or not in the store, is host.ErrNotFound; a
// store that cannot be reached is host.ErrUnavailable.
func (s *Sync) AdoptSnapshot(ctx context.Context, id string) (chunkstore.DownloadStats, error) {
	var st chunkstore.DownloadStats
	if s.cfg.Store == nil || !host.ValidID(id) || s.Deleted(id) {
		return st, fmt.Errorf("snapshot %s: %w", id, host.ErrNotFound)
	}
	m, err := s.cfg.Store.Manifest(ctx, SnapshotSet(id))
	if err != nil {
		return st, s.LookupError(ctx, "snapshot", id, err)
	}
	var si capture.Info
	if len(m.Meta) > 0 {
		if err := json.Unmarshal(m.Meta, &si); err != nil || si.ID != id {
			s.log.Error("snapshot's metadata in the object store is unreadable", "snapshot_id", id, "err", err)
			return st, fmt.Errorf("snapshot %s: %w: its metadata in the object store is unreadable", id, host.ErrCorrupt)
		}
	}
	if st, err = s.FetchSnapshot(ctx, id, m); err != nil {
		return st, err
	}
	if len(m.Meta) == 0 {
		// Uploaded before manifests carried metadata: its snapshot.json
		// (checked with the rest) says the same.
		b, err := os.ReadFile(filepath.Join(s.SnapshotDir(id), capture.MetaFile))
		if err == nil {
			err = json.Unmarshal(b, &si)
		}
		if err != nil {
			return st, fmt.Errorf("snapshot %s: %w: unreadable metadata", id, host.ErrCorrupt)
		}
	}
	si.Stored, si.StoreError, si.UploadedBytes, si.FetchedBytes = "", "", 0, 0
	if err := s.writeRecord(id, Record{Snapshot: si, Durable: true, Fetch: &st}); err != nil {
		return st, fmt.Errorf("adopt snapshot %s: record: %w", id, classifyIO(err))
	}
	s.log.Info("snapshot adopted from the object store", "snapshot_id", id, "sandbox_id", si.SandboxID)
	return st, nil
}

// Download downloads set m into dir, taking from this host what it
// holds: its copy of template key, and of the durable snapshot lineage if
// it derives from one. Lazily (Config.Lazy) if that is worth it;
// otherwise, if this host lacks the template, it starts fetching it for
// the captures to come (StartTemplateFetch, spec the set's machine's).
// The caller checks the files.
func (s *Sync) Download(ctx context.Context, m *chunkstore.Manifest, dir, key, lineage string, spec vmm.Spec) (chunkstore.DownloadStats, error) {
	seeds, release := s.TemplateSeeds(ctx, key)
	defer func() { release() }()
	hasTemplate := len(seeds) > 0
	seeds, release = s.LineageSeeds(ctx, lineage, seeds, release)
	if s.cfg.Lazy != nil && s.cfg.Lazy.Worth(m, seeds) { // lazy restore: the agent's lazy.go
		return s.cfg.Lazy.Download(ctx, m, dir, seeds)
	}
	st, err := s.cfg.Store.DownloadSeeded(ctx, m, dir, seeds)
	if err == nil && !hasTemplate {
		s.StartTemplateFetch(key, spec)
	}
	return st, err
}

// Forget marks snapshot id (described by si) deleted with a tombstone,
// after stopping its upload. The caller holds LockSnapshots, then
// removes the local files and calls StartDelete.
func (s *Sync) Forget(id string, si capture.Info) error {
	s.mu.Lock()
	j := s.jobs[SnapshotSet(id)]
	if j != nil {
		j.cancel()
	}
	err := s.writeRecord(id, Record{Snapshot: si, Deleted: true})
	delete(s.errs, SnapshotSet(id))
	s.mu.Unlock()
	if j != nil {
		<-j.done
	}
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, classifyIO(err))
	}
	return nil
}

// StartDelete removes snapshot id's manifest from the store in the
// background (retried until it succeeds), then its tombstone, then
// collects garbage.
func (s *Sync) StartDelete(id string) {
	s.Start(SnapshotSet(id), KindDelete, "delete snapshot from the object store", false, func(ctx context.Context) error {
		if err := s.FetchAllLazy(ctx, SnapshotSet(id)); err != nil {
			return err
		}
		if err := s.cfg.Store.Delete(ctx, SnapshotSet(id)); err != nil && !errors.Is(err, objstore.ErrNotFound) {
			return err
		}
		if err := os.Remove(s.RecordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		s.log.Info("snapshot deleted from the object store", "snapshot_id", id)
		s.StartGC()
		return nil
	})
}

// FetchAllLazy is called before set name leaves the store: machines of
// this host restored lazily from it get every chunk of its memory image
// first (Lazy.FetchAll; nothing without lazy restore).
func (s *Sync) FetchAllLazy(ctx context.Context, name string) error {
	if s.cfg.Lazy == nil {
		return nil
	}
	return s.cfg.Lazy.FetchAll(ctx, name)
}
