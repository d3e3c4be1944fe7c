package hostagent

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
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Paused sandboxes in the object store (Config.Store; docs/storage.md).
//
// A pause captures the sandbox on this host's disk as always; then a
// background upload (the same jobs, retries and backoff as snapshots')
// stores the capture as the chunkstore set paused/<id>: its files vm.mem,
// vm.state, rootfs.ext4 and manifest.json (their checksums), and in the
// manifest's Meta the sandbox's record (sandbox.json: template, spec,
// environment, owner, hostname, network policy, ...). When the manifest
// is written the agent records the capture durable in
// STORE/stored/paused/<id>.<pause id>.json, and Info.Stored says durable.
//
// Each pause has its own PauseID (record.PauseID), carried in the set's
// Meta. A host removes paused/<id> from the store only if the set there
// still carries the PauseID of the capture it held: a stale copy's kill
// never deletes a later pause of the same sandbox made elsewhere.
//
// Resume of a sandbox this host does not hold (adoptPaused) looks for
// paused/<id> in the store, downloads it into STORE/fetch/<id>, checks it
// against its checksums, writes its record and moves it into place as a
// paused sandbox of this host; the resume then goes on as a local one.
//
// A capture that no longer serves — its sandbox resumed (here or, after
// adoption, on another host) or killed — is tombstoned first (its record
// file rewritten with deleted), then the set is removed from the store in
// the background (its manifest, then garbage collection), then the
// tombstone. A tombstone found at start finishes that delete. Resuming a
// sandbox whose upload still runs cancels the upload (and waits for it)
// before it touches the capture; the set, complete or not, is then
// deleted like any stale capture. The uploads and deletes of one set run
// one after the other (storesync chains them: Sync.StartLocked).

// pausedMeta is the Meta of a set paused/<id>: what another host needs to
// adopt the sandbox (storesync.PausedMeta reads its PauseID).
type pausedMeta struct {
	Sandbox record `json:"sandbox"`
}

// fetchDir (in the store volume) holds captures being downloaded from the
// object store.
const fetchDir = "fetch"

// newPauseID names a new pause capture.
func newPauseID() string { return randHex(8) }

// startPausedUpload uploads the capture of the paused sandbox s in the
// background, after any job of its set that still runs, unless the agent
// has no store.
func (a *Agent) startPausedUpload(s *sandbox) {
	if a.store == nil {
		return
	}
	s.mu.Lock()
	pid, durable := s.rec.PauseID, s.durablePause == s.rec.PauseID
	s.mu.Unlock()
	if pid == "" || durable {
		return
	}
	a.sync.Lock()
	defer a.sync.Unlock()
	if j := a.sync.JobLocked(storesync.PausedSet(s.id())); j != nil && j.Kind() == storesync.KindUpload {
		return // uploading already
	}
	a.sync.StartLocked(storesync.PausedSet(s.id()), storesync.KindUpload, "upload paused sandbox", true, func(ctx context.Context) error {
		return a.uploadPaused(ctx, s, pid)
	})
}

// uploadPaused stores capture pauseID of the paused sandbox s as the set
// paused/<id> and records it durable. It does nothing once s is no longer
// paused with that capture (resumed, killed).
func (a *Agent) uploadPaused(ctx context.Context, s *sandbox, pauseID string) error {
	id := s.id()
	s.mu.Lock()
	rec, state := s.rec, s.state
	s.mu.Unlock()
	if s.stopping() || state != StatePaused || rec.PauseID != pauseID {
		return nil
	}
	r, ok := a.sync.PausedRecord(id, pauseID)
	if ok && r.Durable && !r.Deleted && !r.Refresh {
		s.setDurablePause(pauseID)
		return nil
	}
	if ok && r.Durable && r.Refresh {
		// Uploaded before: unless the store still holds this capture, it
		// was resumed or killed elsewhere, and uploading it again would
		// bring a stale copy back.
		if err := a.checkNotMoved(ctx, id, pauseID); err != nil {
			return err
		}
	}
	rec.State, rec.Op, rec.NetNS = StatePaused, "", ""
	meta, err := json.Marshal(pausedMeta{Sandbox: rec})
	if err != nil {
		return err
	}
	if err := a.sync.UploadPaused(ctx, id, pauseID, filepath.Join(s.dir, pausedDir), rec.Template, meta); err != nil {
		return err
	}
	s.setDurablePause(pauseID)
	return nil
}

func (s *sandbox) setDurablePause(pauseID string) {
	s.mu.Lock()
	s.durablePause = pauseID
	s.mu.Unlock()
}

// pauseID is s's current capture ("" if none).
func (s *sandbox) pauseID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.PauseID
}

// dropPaused is called by a resume that succeeded, holding s's operation
// slot: the capture it resumed from is stale. It is tombstoned (its
// upload stopped) and forgotten; the caller removes the local files and
// then calls startPausedDelete with the returned PauseID ("" if there is
// nothing to delete: the agent has no store).
func (a *Agent) dropPaused(s *sandbox) (string, error) {
	pid := s.pauseID()
	if a.store != nil && pid != "" {
		if err := a.sync.TombstonePaused(s.id(), pid); err != nil {
			return "", err
		}
	}
	s.mu.Lock()
	s.rec.PauseID, s.durablePause = "", ""
	s.mu.Unlock()
	if a.store == nil {
		return "", nil
	}
	return pid, nil
}

// restagePaused uploads the paused sandbox s again, its record having
// changed (SetNetwork): the set's Meta must say what a resume elsewhere
// restores. Its chunks are in the store already; only the manifest is
// new. Until it is written the sandbox is uploading (a crash leaves the
// record marked for Refresh: the next start uploads it).
func (a *Agent) restagePaused(s *sandbox) {
	if a.store == nil {
		return
	}
	a.sync.StopPausedUpload(s.id())
	s.mu.Lock()
	pid := s.rec.PauseID
	paused := s.state == StatePaused
	s.durablePause = ""
	s.mu.Unlock()
	if !paused || pid == "" {
		return
	}
	if r, ok := a.sync.PausedRecord(s.id(), pid); ok && r.Durable && !r.Deleted && !r.Refresh {
		r.Refresh = true
		if err := a.sync.WritePausedRecord(r); err != nil {
			a.log.Warn("mark a paused sandbox for upload", "sandbox_id", s.id(), "err", err)
		}
	}
	a.startPausedUpload(s)
}

// errMoved: a capture this host made durable is no longer in the object
// store (its sandbox was resumed, or killed, on another host); this
// host's copy is stale.
var errMoved = errors.New("the object store no longer holds this capture: the sandbox was resumed or killed on another host, and this host's copy is stale")

// checkNotMoved fails with errMoved if the store no longer holds capture
// pauseID of sandbox id as paused/<id> (it held it: the caller knows the
// capture was durable).
func (a *Agent) checkNotMoved(ctx context.Context, id, pauseID string) error {
	m, err := a.store.Manifest(ctx, storesync.PausedSet(id))
	if errors.Is(err, objstore.ErrNotFound) {
		return errMoved
	}
	if err != nil {
		return err
	}
	var meta pausedMeta
	if json.Unmarshal(m.Meta, &meta) == nil && meta.Sandbox.PauseID != pauseID {
		return errMoved
	}
	return nil
}

// checkResumable refuses (ErrConflict) the local resume of a paused
// sandbox whose durable capture the object store no longer holds: another
// host resumed it (or killed it) and the sandbox lives on there, so
// resuming this stale copy would run it twice. A store that cannot be
// reached does not hold a resume up: this host's copy is resumed.
func (a *Agent) checkResumable(ctx context.Context, s *sandbox) error {
	if a.store == nil {
		return nil
	}
	pid := s.pauseID()
	if r, ok := a.sync.PausedRecord(s.id(), pid); pid == "" || !ok || !r.Durable || r.Deleted {
		return nil // never in the store: no other host can have resumed it
	}
	err := a.checkNotMoved(ctx, s.id(), pid)
	switch {
	case errors.Is(err, errMoved):
		a.log.Warn("refused to resume a stale copy of a sandbox resumed elsewhere", "sandbox_id", s.id(), "pause_id", pid)
		return fmt.Errorf("sandbox %s: %w: it was resumed or killed on another host sharing the object store; this host's copy is stale (kill it here)", s.id(), ErrConflict)
	case err != nil:
		a.log.Warn("cannot check the object store before a resume; resuming this host's copy", "sandbox_id", s.id(), "err", err)
	}
	return nil
}

// adoptPaused makes the paused sandbox id, which this host does not hold,
// one of its paused sandboxes from the object store's set paused/<id>:
// its capture is downloaded into STORE/fetch/<id>, checked against its
// checksums, given its record (from the set's Meta) and moved into place.
// ErrNotFound if the store has no such set (or this host killed or
// resumed that capture already); host.ErrUnavailable if the store cannot
// be reached; ErrCorrupt if the copy fails its checksums. Nothing is left
// behind on failure.
func (a *Agent) adoptPaused(ctx context.Context, id string) (*sandbox, error) {
	if a.store == nil || !host.ValidID(id) {
		return nil, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	a.adoptMu.Lock()
	defer a.adoptMu.Unlock()
	if s, err := a.get(id); err == nil {
		return s, nil // adopted by a resume before this one
	}
	m, err := a.store.Manifest(ctx, storesync.PausedSet(id))
	if err != nil {
		return nil, a.sync.LookupError(ctx, "sandbox", id, err)
	}
	var meta pausedMeta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || meta.Sandbox.ID != id || meta.Sandbox.PauseID == "" {
		a.log.Error("paused sandbox's record in the object store is unreadable", "sandbox_id", id, "err", err)
		return nil, fmt.Errorf("sandbox %s: %w: its record in the object store is unreadable", id, ErrCorrupt)
	}
	rec := meta.Sandbox
	if a.sync.Tombstoned(id, rec.PauseID) {
		return nil, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	if err := a.checkSpace(); err != nil {
		return nil, fmt.Errorf("resume %s: %w", id, err)
	}
	a.mu.Lock()
	closing := a.closed
	a.mu.Unlock()
	if closing {
		return nil, fmt.Errorf("%w: host agent is shutting down", ErrConflict)
	}
	final := filepath.Join(a.sbDir, id)
	if _, err := os.Stat(final); err == nil {
		return nil, fmt.Errorf("sandbox %s: %w: this host has files of a sandbox of that id", id, ErrConflict)
	}
	tmp := filepath.Join(a.vol.Dir, fetchDir, id)
	os.RemoveAll(tmp)
	t0 := time.Now()
	// Chunks this host's copy of its template holds come from there, and
	// those of the snapshot it derives from if held here.
	st, err := a.sync.Download(ctx, m, filepath.Join(tmp, pausedDir), rec.Template, rec.lineage(), rec.Spec)
	if err == nil {
		if verr := capture.CheckDownloaded(filepath.Join(tmp, pausedDir)); verr != nil {
			err = fmt.Errorf("%w: %w", ErrCorrupt, verr)
		}
	}
	tDownload := time.Since(t0)
	// Per-host parts of the record are this host's to make at restore.
	rec.State, rec.Op, rec.NetNS = StatePaused, "", ""
	rec.Spec.MemoryFile, rec.Spec.Disk, rec.Spec.RunDir, rec.Spec.ConsoleLog, rec.Spec.GID = "", "", "", "", 0
	if err == nil {
		err = writeJSON(filepath.Join(tmp, "sandbox.json"), rec, true)
	}
	if err == nil {
		err = manifest.Rename(tmp, final)
	}
	if err != nil {
		os.RemoveAll(tmp)
		a.log.Error("fetch paused sandbox from the object store", "sandbox_id", id, "err", err)
		return nil, storesync.FetchFailed(ctx, "sandbox", id, err, storesync.FetchWhy{
			Unavailable: fmt.Sprintf("sandbox %s is paused in the object store, which cannot be reached; retry when it is back", id),
			NotFound:    "its capture left the object store while it was downloaded",
			Corrupt:     "its capture in the object store does not match its checksums",
		})
	}
	pr := storesync.PausedRecord{SandboxID: id, PauseID: rec.PauseID, Durable: true, Adopted: true}
	if err := a.sync.WritePausedRecord(pr); err != nil {
		// Not fatal: the capture is uploaded again (its chunks are there).
		a.log.Warn("record adopted paused sandbox durable", "sandbox_id", id, "err", err)
	}
	s := newSandbox(rec, final, filepath.Join(a.cfg.RunDir, id), StatePaused)
	s.durablePause = rec.PauseID
	s.fetched = st.BytesFetched
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, dup := a.sandboxes[id]; dup || a.closed {
		// Cannot happen under adoptMu but for a create of the same id.
		return nil, fmt.Errorf("sandbox %s: %w: id in use", id, ErrConflict)
	}
	a.sandboxes[id] = s
	a.log.Info("paused sandbox adopted from the object store", "sandbox_id", id, "pause_id", rec.PauseID,
		"download_ms", tDownload.Milliseconds(), "bytes", allocated(filepath.Join(final, pausedDir)),
		"chunks_fetched", st.ChunksFetched, "chunks_delta", st.ChunksDelta, "bytes_fetched", st.BytesFetched, "chunks_local", st.ChunksSeeded,
		"bytes_local", st.BytesSeeded, "chunks_reflinked", st.ChunksCloned)
	return s, nil
}

// killInStore kills the paused sandbox id that this host does not hold
// but the object store does (its host is lost): its set is tombstoned
// here and removed in the background. ErrNotFound if the store has no
// paused/<id> (or this host removes it already).
func (a *Agent) killInStore(ctx context.Context, id string) error {
	if !host.ValidID(id) || a.sync.Tombstoned(id, "") {
		return fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	m, err := a.store.Manifest(ctx, storesync.PausedSet(id))
	if err != nil {
		return a.sync.LookupError(ctx, "sandbox", id, err)
	}
	var meta pausedMeta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || meta.Sandbox.ID != id || meta.Sandbox.PauseID == "" {
		return fmt.Errorf("sandbox %s: %w: its record in the object store is unreadable", id, ErrCorrupt)
	}
	if err := a.sync.TombstonePaused(id, meta.Sandbox.PauseID); err != nil {
		return err
	}
	a.sync.StartPausedDelete(id, meta.Sandbox.PauseID)
	a.log.Info("killed a paused sandbox held only in the object store", "sandbox_id", id)
	return nil
}

// resumePausedStore, at start, finishes the deletes of stale captures an
// earlier run left, forgets records no paused sandbox of this host needs,
// and uploads every paused sandbox's capture not yet durable.
func (a *Agent) resumePausedStore() {
	dir := filepath.Join(a.vol.Dir, storesync.StoredDir, storesync.PausedRecordDir)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		id, pid, ok := storesync.ParsePausedRecordName(e.Name())
		if !ok {
			continue
		}
		r, ok := a.sync.PausedRecord(id, pid)
		switch {
		case ok && r.Deleted:
			a.sync.StartPausedDelete(id, pid)
			continue
		case ok && r.Durable:
			if s, err := a.get(id); err == nil && s.pauseID() == pid && s.getState() == StatePaused {
				if !r.Refresh { // else uploaded again below
					s.setDurablePause(pid)
				}
				continue
			}
		}
		// Superseded, or its sandbox was not recovered: the set in the
		// store (if any) is left alone, for a resume elsewhere.
		os.Remove(filepath.Join(dir, e.Name()))
	}
	a.mu.Lock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	for _, s := range all {
		if s.getState() != StatePaused {
			continue
		}
		if s.pauseID() == "" { // paused before captures had IDs
			s.mu.Lock()
			s.rec.PauseID = newPauseID()
			s.mu.Unlock()
			if err := s.writeRecord(true); err != nil {
				a.log.Warn("name the capture of a paused sandbox", "sandbox_id", s.id(), "err", err)
				continue
			}
		}
		a.startPausedUpload(s)
	}
}
