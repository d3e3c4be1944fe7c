package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/chunkstore"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/manifest"
	"github.com/pandastack/pandastack/internal/template"
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

// chunkSize is the chunk size of template indexes: the store's, or the
// default without one.
func (a *Agent) chunkSize() int64 {
	if a.store != nil {
		return a.store.ChunkSize()
	}
	return chunkstore.DefaultChunkSize
}

// SendSnapshot writes snapshot id, held on this host, to w as a pack
// diffed against this host's copy of its template (whole chunks if it has
// none). ErrNotFound if the host does not hold the snapshot's files.
func (a *Agent) SendSnapshot(ctx context.Context, id string, w io.Writer) (chunkstore.PackStats, error) {
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
	bases, release := a.templateBases(ctx, si.Template)
	defer release()
	st, err := chunkstore.WritePack(ctx, w, files, chunkstore.PackOptions{ChunkSize: a.chunkSize(), Meta: meta, Bases: bases})
	if err != nil {
		return st, fmt.Errorf("send snapshot %s: %w", id, err)
	}
	a.log.Info("snapshot sent", "snapshot_id", id, "dur_ms", st.Dur.Milliseconds(), "setup_ms", st.SetupDur.Milliseconds(), "bytes", st.Bytes, "chunks_base", st.BaseChunks,
		"chunks_patch", st.PatchChunks, "chunks_whole", st.WholeChunks, "zero_chunks", st.ZeroChunks, "chunks_unread", st.Unread,
		"bytes_read", st.BytesRead, "dirty_bytes", si.Capture.DirtyBytes)
	return st, nil
}

// ReceiveSnapshot reads a pack of snapshot id (SendSnapshot's, from
// another host) from r and keeps it as this host's snapshot id, complete
// or not at all; a create from it then restores as from any snapshot. Its
// FetchedBytes is the length of the pack. Errors: ErrConflict if the host
// has a snapshot id already; template.ErrNotFound if the host lacks the
// snapshot's template, or holds another bake of it, before anything is
// written (the caller sends it another way); ErrCorrupt if the stream is
// cut short or damaged; ErrInvalid if it is not snapshot id's.
func (a *Agent) ReceiveSnapshot(ctx context.Context, id string, r io.Reader) (SnapshotInfo, error) {
	if !host.ValidID(id) {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot: %w: id %q must be lowercase letters and digits", ErrInvalid, id)
	}
	// One at a time, and never while a delete of it runs (fetchMu: as a
	// download from the store).
	a.fetchMu.Lock()
	defer a.fetchMu.Unlock()
	dir := a.snapshotDir(id)
	if _, err := os.Stat(dir); err == nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: exists", id, ErrConflict)
	}
	if _, ok := a.storedRecord(id); ok {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: exists (or was deleted) here", id, ErrConflict)
	}
	if err := a.checkSpace(); err != nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w", id, err)
	}
	t0 := time.Now()
	br := bufio.NewReaderSize(r, 1<<20)
	h, err := chunkstore.ReadPackHeader(br)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: %w", id, ErrCorrupt, err)
	}
	var si SnapshotInfo
	if err := json.Unmarshal(h.Meta, &si); err != nil || si.ID != id {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: the pack holds snapshot %q", id, ErrInvalid, si.ID)
	}
	seeds, release := a.templateSeeds(ctx, si.Template)
	defer release()
	if h.Base != "" && len(seeds) == 0 {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: this host has no usable copy of template %s; send it through the object store", id, template.ErrNotFound, si.Template)
	}
	tmp := dir + fetchSuffix
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w", id, classifyIOError(err))
	}
	st, err := chunkstore.ReadPack(ctx, br, h, tmp, seeds)
	if err == nil {
		if verr := checkDownloaded(tmp); verr != nil {
			err = fmt.Errorf("%w: %w", ErrCorrupt, verr)
		}
	}
	if err == nil {
		if si.Transient {
			err = os.Rename(tmp, dir) // as the capture itself: unflushed
		} else {
			err = manifest.Rename(tmp, dir)
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		switch {
		case errors.Is(err, chunkstore.ErrPackBase):
			return SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: this host's copy of template %s is not the sender's: %w", id, template.ErrNotFound, si.Template, err)
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
		a.startUpload(id) // a snapshot of this host's now: durable as its own
	}
	out, err := a.GetSnapshot(id)
	out.FetchedBytes = st.Bytes
	return out, err
}
