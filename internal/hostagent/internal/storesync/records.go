package storesync

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// StoredDir holds the records of snapshots in the object store, in the
// store volume.
const StoredDir = "stored"

// Record is STORE/stored/<id>.json: what this host knows of snapshot
// id's copy in the object store.
type Record struct {
	// Snapshot is the snapshot's metadata (its snapshot.json).
	Snapshot capture.Info `json:"snapshot"`
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

// RecordPath is the path of snapshot id's record.
func (s *Sync) RecordPath(id string) string {
	return filepath.Join(s.cfg.Dir, StoredDir, id+".json")
}

// Record reads snapshot id's record; false if there is none (or it
// cannot be read: the snapshot is then uploaded again).
func (s *Sync) Record(id string) (Record, bool) {
	var r Record
	b, err := os.ReadFile(s.RecordPath(id))
	if err != nil || json.Unmarshal(b, &r) != nil {
		return Record{}, false
	}
	return r, true
}

// Deleted reports whether snapshot id has a tombstone.
func (s *Sync) Deleted(id string) bool {
	r, ok := s.Record(id)
	return ok && r.Deleted
}

// writeRecord writes snapshot id's record, flushed.
func (s *Sync) writeRecord(id string, r Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return manifest.WriteFile(s.RecordPath(id), b, 0o600)
}
