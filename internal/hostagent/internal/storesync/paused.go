package storesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Paused sandboxes in the object store (docs/storage.md): the set
// paused/<id> of a paused sandbox's capture and this host's records of
// it. What a paused sandbox is, and when its capture is uploaded, stale
// or adopted, is the agent's (paused.go there); the set's Meta is the
// agent's too, of which this package reads the capture's PauseID only
// (PausedMeta).
//
// Each pause has its own PauseID, carried in the set's Meta. A host
// removes paused/<id> from the store only if the set there still carries
// the PauseID of the capture it held (StartPausedDelete): a stale copy's
// kill never deletes a later pause of the same sandbox made elsewhere.

// PausedSet is a paused sandbox's set name in the chunkstore.
func PausedSet(id string) string { return "paused/" + id }

// PausedRecordDir holds the records of paused sandboxes' captures, under
// StoredDir.
const PausedRecordDir = "paused"

// PausedRecord is STORE/stored/paused/<id>.<pause id>.json.
type PausedRecord struct {
	SandboxID string `json:"sandbox_id"`
	PauseID   string `json:"pause_id"`
	// Durable: the store holds this capture's manifest and chunks.
	Durable bool `json:"durable,omitempty"`
	// Deleted: the capture no longer serves (its sandbox resumed or was
	// killed); its set in the store is still to be removed.
	Deleted bool `json:"deleted,omitempty"`
	// Adopted: downloaded from the store (resumed from another host).
	Adopted bool `json:"adopted,omitempty"`
	// Refresh: the sandbox's record changed since the upload (SetNetwork);
	// the set is uploaded again so that its Meta says so.
	Refresh    bool             `json:"refresh,omitempty"`
	UploadedAt time.Time        `json:"uploaded_at,omitzero"`
	Upload     chunkstore.Stats `json:"upload"`
}

// PausedMeta is what this package reads of the Meta of a set paused/<id>
// (the agent's, which holds the sandbox's whole record there).
type PausedMeta struct {
	Sandbox struct {
		ID      string `json:"id"`
		PauseID string `json:"pause_id,omitempty"`
	} `json:"sandbox"`
}

// PausedRecordPath is the path of the record of capture pauseID of
// sandbox id.
func (s *Sync) PausedRecordPath(id, pauseID string) string {
	return filepath.Join(s.cfg.Dir, StoredDir, PausedRecordDir, id+"."+pauseID+".json")
}

// PausedRecord reads the record of capture pauseID of sandbox id; false
// if there is none (or it cannot be read).
func (s *Sync) PausedRecord(id, pauseID string) (PausedRecord, bool) {
	var r PausedRecord
	b, err := os.ReadFile(s.PausedRecordPath(id, pauseID))
	if err != nil || json.Unmarshal(b, &r) != nil {
		return PausedRecord{}, false
	}
	return r, true
}

// WritePausedRecord writes r, flushed.
func (s *Sync) WritePausedRecord(r PausedRecord) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return manifest.WriteFile(s.PausedRecordPath(r.SandboxID, r.PauseID), b, 0o600)
}

// Tombstoned reports whether this host holds a tombstone of sandbox id's
// capture pauseID ("": of any capture of id).
func (s *Sync) Tombstoned(id, pauseID string) bool {
	if pauseID != "" {
		r, ok := s.PausedRecord(id, pauseID)
		return ok && r.Deleted
	}
	files, _ := filepath.Glob(filepath.Join(s.cfg.Dir, StoredDir, PausedRecordDir, id+".*.json"))
	for _, f := range files {
		if _, pid, ok := ParsePausedRecordName(filepath.Base(f)); ok {
			if r, ok := s.PausedRecord(id, pid); ok && r.Deleted {
				return true
			}
		}
	}
	return false
}

// ParsePausedRecordName is the sandbox and capture a record's file name
// names (false: none).
func ParsePausedRecordName(name string) (id, pauseID string, ok bool) {
	base, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return "", "", false
	}
	id, pauseID, ok = strings.Cut(base, ".")
	return id, pauseID, ok && host.ValidID(id) && host.ValidID(pauseID)
}

// UploadPaused stores capture pauseID of sandbox id, whose files are in
// dir, as the set paused/<id> with meta (the agent's PausedMeta), its
// chunks its template shares taken as known, and records it durable.
func (s *Sync) UploadPaused(ctx context.Context, id, pauseID, dir, template string, meta []byte) error {
	files := map[string]string{}
	for _, f := range []string{capture.MemFile, capture.StateFile, capture.DiskFile, manifest.Name} {
		p := filepath.Join(dir, f)
		if _, err := os.Stat(p); err == nil {
			files[f] = p
		} else if f != manifest.Name { // captures older than checksums have none
			return fmt.Errorf("upload paused sandbox %s: %w", id, err)
		}
	}
	s.StartTemplateSync(template, false)
	t0 := time.Now()
	bases, release := s.TemplateBases(ctx, template)
	_, st, err := s.cfg.Store.UploadWith(ctx, PausedSet(id), files, chunkstore.UploadOptions{Meta: meta, Bases: bases, Known: []string{TemplateSet(template)}}, nil)
	release()
	if err != nil {
		return err
	}
	pr := PausedRecord{SandboxID: id, PauseID: pauseID, Durable: true, UploadedAt: time.Now().UTC(), Upload: st}
	if err := s.WritePausedRecord(pr); err != nil {
		return fmt.Errorf("upload paused sandbox %s: record: %w", id, classifyIO(err))
	}
	s.log.Info("paused sandbox durable in the object store", "sandbox_id", id, "dur_ms", time.Since(t0).Milliseconds(),
		"chunks", st.ChunksTotal, "chunks_uploaded", st.ChunksUploaded, "chunks_delta", st.ChunksDelta, "chunks_shared", st.ChunksShared, "chunks_unread", st.ChunksUnread,
		"zero_chunks", st.ZeroChunks, "bytes_uploaded", st.BytesUploaded)
	return nil
}

// StopPausedUpload cancels the upload of sandbox id's capture, if one
// runs, and waits for it to end.
func (s *Sync) StopPausedUpload(id string) {
	if s.cfg.Store != nil {
		s.CancelJob(PausedSet(id), KindUpload)
	}
}

// TombstonePaused marks capture pauseID of sandbox id stale (its sandbox
// was resumed or killed), durably, after stopping its upload; the caller
// then calls StartPausedDelete.
func (s *Sync) TombstonePaused(id, pauseID string) error {
	s.StopPausedUpload(id)
	s.mu.Lock()
	delete(s.errs, PausedSet(id))
	s.mu.Unlock()
	r, _ := s.PausedRecord(id, pauseID)
	r.SandboxID, r.PauseID, r.Deleted = id, pauseID, true
	if err := s.WritePausedRecord(r); err != nil {
		return fmt.Errorf("sandbox %s: record its capture stale: %w", id, classifyIO(err))
	}
	return nil
}

// StartPausedDelete removes the set paused/<id> from the store in the
// background if it still holds capture pauseID (retried until it
// succeeds), then its tombstone, then collects garbage.
func (s *Sync) StartPausedDelete(id, pauseID string) {
	if s.cfg.Store == nil {
		return
	}
	s.Start(PausedSet(id), KindDelete, "delete paused sandbox from the object store", true, func(ctx context.Context) error {
		if err := s.FetchAllLazy(ctx, PausedSet(id)); err != nil {
			return err
		}
		removed := false
		m, err := s.cfg.Store.Manifest(ctx, PausedSet(id))
		switch {
		case errors.Is(err, objstore.ErrNotFound):
		case err != nil:
			return err
		default:
			var meta PausedMeta
			if json.Unmarshal(m.Meta, &meta) == nil && meta.Sandbox.PauseID == pauseID {
				if err := s.cfg.Store.Delete(ctx, PausedSet(id)); err != nil && !errors.Is(err, objstore.ErrNotFound) {
					return err
				}
				removed = true
			}
		}
		if err := os.Remove(s.PausedRecordPath(id, pauseID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if removed {
			s.log.Info("paused sandbox's capture deleted from the object store", "sandbox_id", id, "pause_id", pauseID)
			s.StartGC()
		}
		return nil
	})
}
