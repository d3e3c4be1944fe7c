package hostagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// SnapshotInfo is a snapshot as this host records it: capture.Info.
type SnapshotInfo = capture.Info

// snapshotImage is the image a snapshot restores.
func (a *Agent) snapshotImage(si SnapshotInfo) image {
	return image{Dir: a.snapshotDir(si.ID), Spec: si.Spec, Template: si.Template, lineage: lineageOf(si)}
}

func (a *Agent) snapshotDir(id string) string { return filepath.Join(a.vol.Dir, "snapshots", id) }

// snapshotMeta is the snapshot's metadata file inside its directory.
const snapshotMeta = capture.MetaFile

// Snapshot captures the running sandbox id into a durable snapshot
// snapID. The sandbox runs on. When Snapshot returns, the snapshot's files
// are on stable storage with their checksums (a crash before that leaves
// only a temporary directory that recovery removes).
func (a *Agent) Snapshot(ctx context.Context, id, snapID string) (SnapshotInfo, error) {
	return a.snapshot(ctx, id, snapID, false)
}

// SnapshotTransient is Snapshot for a capture that only carries the
// sandbox to other hosts through the object store (a cross-host fork):
// the caller deletes it once they have restored from it. It is neither
// sealed with checksums nor flushed here: the object store's chunks are
// content-addressed and checked on every fetch, and a restart of this
// agent deletes it (SnapshotInfo.Transient; dropTransient), from the store
// too. Everything else is as for Snapshot (it restores, lists and
// deletes as a snapshot), except that its upload starts only once someone
// waits for it (AwaitStored): a capture sent straight to the other hosts
// (SendSnapshot) never goes to the store.
func (a *Agent) SnapshotTransient(ctx context.Context, id, snapID string) (SnapshotInfo, error) {
	return a.snapshot(ctx, id, snapID, true)
}

func (a *Agent) snapshot(ctx context.Context, id, snapID string, transient bool) (SnapshotInfo, error) {
	if !host.ValidID(snapID) {
		return SnapshotInfo{}, fmt.Errorf("snapshot: %w: id %q must be lowercase letters and digits", ErrInvalid, snapID)
	}
	s, err := a.get(id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := a.checkSpace(); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot: %w", err)
	}
	dir := a.snapshotDir(snapID)
	if _, err := os.Stat(dir); err == nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w: exists", snapID, ErrConflict)
	}
	if _, ok := a.sync.Record(snapID); ok {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w: exists (in the object store)", snapID, ErrConflict)
	}
	ctx, end, err := s.begin(ctx, "snapshot", StateRunning)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer end()
	t0 := time.Now()
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	st, err := a.capture(ctx, s, tmp, false)
	if err != nil {
		if s.stopping() {
			return SnapshotInfo{}, errStopped(s, "snapshot")
		}
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	tCapture := time.Since(t0)
	s.mu.Lock()
	si := SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: snapID, SandboxID: id, Template: s.rec.Template, CreatedAt: time.Now().UTC(), Capture: st, Transient: transient, Lineage: s.rec.lineage()}, Spec: s.rec.Spec}
	s.mu.Unlock()
	// Per-machine paths are not part of a snapshot.
	si.Spec.MemoryFile, si.Spec.Disk, si.Spec.RunDir, si.Spec.ConsoleLog = "", "", "", ""
	si.SizeBytes = allocated(tmp)
	err = writeJSON(filepath.Join(tmp, snapshotMeta), si, false)
	switch {
	case err != nil:
	case transient:
		// Complete once renamed (recovery removes a .tmp directory, and
		// the snapshot once it is named: it is transient).
		err = os.Rename(tmp, dir)
	default:
		_, err = manifest.Seal(tmp, memFile, stateFile, diskFile, snapshotMeta)
		if err == nil {
			err = manifest.Rename(tmp, dir)
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return SnapshotInfo{}, fmt.Errorf("snapshot: %w", classifyIOError(err))
	}
	if fp, err := manifest.Fingerprint(dir); err == nil {
		a.mu.Lock()
		a.verified[snapID] = fp // its checksums were just computed from these files
		a.mu.Unlock()
	}
	a.log.Info("snapshot taken", "sandbox_id", id, "snapshot_id", snapID, "transient", transient, "paused_ms", st.PausedMS, "dirty_mib", st.DirtyBytes>>20,
		"capture_ms", tCapture.Milliseconds(), "seal_ms", (time.Since(t0) - tCapture).Milliseconds(), "dur_ms", time.Since(t0).Milliseconds())
	a.storeState(&si) // uploading (or local): before the upload can end
	if !transient {
		// A transient capture is uploaded once someone waits for it
		// (AwaitStored): one sent straight to another host never is.
		a.sync.StartUpload(snapID)
	}
	return si, nil
}

// GetSnapshot describes a snapshot; ErrNotFound if there is none. A
// snapshot durable in the object store whose directory this host lost is
// described from its record (and fetched by the next create from it).
func (a *Agent) GetSnapshot(id string) (SnapshotInfo, error) {
	if !host.ValidID(id) {
		return SnapshotInfo{}, fmt.Errorf("snapshot %q: %w", id, ErrNotFound)
	}
	rec, stored := a.sync.Record(id)
	if stored && rec.Deleted {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	dir := a.snapshotDir(id)
	b, err := os.ReadFile(filepath.Join(dir, snapshotMeta))
	if errors.Is(err, os.ErrNotExist) {
		if a.store != nil && stored && rec.Durable {
			si := rec.Snapshot
			a.storeState(&si)
			return si, nil
		}
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("read snapshot %s: %w", id, err)
	}
	var si SnapshotInfo
	if err := json.Unmarshal(b, &si); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w: unreadable metadata", id, ErrCorrupt)
	}
	a.storeState(&si)
	return si, nil
}

// verifySnapshot checks a snapshot's files against their checksums before
// a restore: ErrCorrupt if they do not match. Files unchanged since they
// last passed (same fingerprint) are not read again. Snapshots taken
// before checksums existed have no manifest and are trusted as they are.
func (a *Agent) verifySnapshot(si SnapshotInfo) error {
	fp, err := manifest.Fingerprint(a.snapshotDir(si.ID))
	if err == nil {
		a.mu.Lock()
		ok := a.verified[si.ID] == fp
		a.mu.Unlock()
		if ok {
			return nil
		}
	}
	if err := capture.Verify(a.snapshotDir(si.ID)); err != nil {
		a.log.Error("snapshot failed its checksums", "snapshot_id", si.ID, "err", err)
		return fmt.Errorf("snapshot %s: %w: its files do not match their checksums; delete it", si.ID, ErrCorrupt)
	}
	if fp != "" {
		a.mu.Lock()
		a.verified[si.ID] = fp
		a.mu.Unlock()
	}
	return nil
}

// Snapshots lists the snapshots on this host, and those durable in its
// object store whose files it lost, oldest first. A snapshot whose
// metadata cannot be read is listed with its ID only (it exists, but
// nothing more is known of it).
func (a *Agent) Snapshots() []SnapshotInfo {
	ents, _ := os.ReadDir(filepath.Join(a.vol.Dir, "snapshots"))
	var out []SnapshotInfo
	seen := map[string]bool{}
	for _, e := range ents {
		if !host.ValidID(e.Name()) {
			continue // a snapshot being taken (.tmp), fetched (.fetch) or deleted (.deleting)
		}
		seen[e.Name()] = true
		si, err := a.GetSnapshot(e.Name())
		if errors.Is(err, ErrNotFound) {
			continue // deleted, its directory not removed yet
		}
		if err != nil {
			si = SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: e.Name()}}
		}
		out = append(out, si)
	}
	if a.store != nil {
		recs, _ := os.ReadDir(filepath.Join(a.vol.Dir, storesync.StoredDir))
		for _, e := range recs {
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok || seen[id] || !host.ValidID(id) {
				continue
			}
			if si, err := a.GetSnapshot(id); err == nil {
				out = append(out, si)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// deletingSuffix marks a snapshot directory being deleted.
const deletingSuffix = ".deleting"

// DeleteSnapshot removes a snapshot. Sandboxes restored from it keep
// running: they hold their own links to its files. The snapshot is gone
// at once (its directory is renamed away, then removed): a crash in the
// middle leaves no half snapshot, only a directory recovery removes.
// With an object store, a tombstone is written first and the snapshot's
// manifest in the store is removed in the background (store.go).
func (a *Agent) DeleteSnapshot(id string) error {
	if !host.ValidID(id) {
		return fmt.Errorf("snapshot %q: %w", id, ErrNotFound)
	}
	dir := a.snapshotDir(id)
	si, err := a.GetSnapshot(id)
	if err != nil {
		if _, serr := os.Stat(dir); serr != nil {
			return fmt.Errorf("snapshot %s: %w", id, ErrNotFound)
		}
		si = SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: id}} // unreadable metadata: delete it all the same
	}
	if a.store != nil {
		// Not while a create downloads it (that would put it back).
		defer a.sync.LockSnapshots()()
		// The tombstone first: from here the snapshot is gone, and a
		// crash leaves the rest to the next start.
		if err := a.sync.Forget(id, si); err != nil {
			return err
		}
	}
	gone := dir + deletingSuffix
	if err := os.Rename(dir, gone); err != nil && !(a.store != nil && errors.Is(err, os.ErrNotExist)) {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		a.log.Error("remove files of a deleted snapshot", "snapshot_id", id, "err", err)
	}
	a.mu.Lock()
	delete(a.verified, id)
	a.mu.Unlock()
	if a.store != nil {
		a.sync.StartDelete(id)
	}
	return nil
}
