package storesync

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
)

// Ancestor snapshots as the base of a pack. A sandbox created from a
// snapshot S (a prepared environment: packages installed, a repository
// cloned) holds everything S added to its template; a pack of its capture
// diffed against the template carries all of that again, though the
// receiving host may hold S already (it created sandboxes from S too).
// So the receiving host says which durable snapshots it holds
// (HeldSnapshots, sent with its request for the pack), and when the
// capture's sandbox was created from one of them the sender diffs against
// that snapshot instead (PackHeader.BaseName "snapshots/<id>"): the pack
// carries what the sandbox changed since S, no more. Both hosts take the
// snapshot's chunk hashes from its manifest in the object store (the
// snapshot is durable there, its files the same bytes on every host that
// holds it), so neither hashes its files.
//
// A sandbox keeps its lineage (record.Lineage, SnapshotInfo.Lineage on
// its captures): fork children and children made on another host derive
// from what their parent did. And a download from the store of a set
// derived from a snapshot this host holds (a snapshot of such a sandbox,
// its pause) takes that snapshot's chunks from here (LineageSeeds).

// MaxHeldSnapshots bounds the snapshots a host names when it asks for a
// pack (the newest first).
const MaxHeldSnapshots = 64

// HeldSnapshots lists the durable snapshots whose files this host holds
// (newest first, at most MaxHeldSnapshots): the bases a pack sent to it
// may be diffed against (transfer.Transfers.Send's held). Nil without an object
// store.
func (s *Sync) HeldSnapshots() []string {
	if s.cfg.Store == nil {
		return nil
	}
	ents, _ := os.ReadDir(filepath.Join(s.cfg.Dir, "snapshots"))
	type held struct {
		id  string
		mod int64
	}
	var out []held
	for _, e := range ents {
		if !host.ValidID(e.Name()) {
			continue
		}
		if _, ok := s.snapshotBaseFiles(e.Name()); !ok {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, held{e.Name(), fi.ModTime().UnixNano()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].mod > out[j].mod })
	ids := make([]string, 0, min(len(out), MaxHeldSnapshots))
	for _, h := range out[:min(len(out), MaxHeldSnapshots)] {
		ids = append(ids, h.id)
	}
	return ids
}

// snapshotBaseFiles returns the directory of snapshot id if it can be a
// pack's base here: durable in the store, not deleted, its files on this
// host (not a lazy restore's link to the store).
func (s *Sync) snapshotBaseFiles(id string) (string, bool) {
	rec, ok := s.Record(id)
	if !ok || !rec.Durable || rec.Deleted || rec.Snapshot.Transient {
		return "", false
	}
	dir := s.SnapshotDir(id)
	for _, f := range []string{capture.MemFile, capture.DiskFile} {
		fi, err := os.Lstat(filepath.Join(dir, f))
		if err != nil || !fi.Mode().IsRegular() {
			return "", false
		}
	}
	return dir, true
}

// SnapshotBases are this host's files of snapshot id as the bases of a
// pack (by file name, as TemplateBases), with the chunk hashes of its
// manifest in the object store, open (the caller calls release). Nil if
// it cannot be one (snapshotBaseFiles) or its manifest cannot be read.
func (s *Sync) SnapshotBases(ctx context.Context, id string) (bases map[string]chunkstore.Seed, release func()) {
	release = func() {}
	dir, ok := s.snapshotBaseFiles(id)
	if !ok {
		return nil, release
	}
	// Its files as sealed (checked once, then while they keep their
	// fingerprint): a chunk reflinked from here is not hashed again.
	if s.cfg.VerifySnapshot(id) != nil {
		return nil, release
	}
	m, err := s.cfg.Store.Manifest(ctx, SnapshotSet(id))
	if err != nil || m.ChunkSize != s.ChunkSize() {
		if err != nil {
			s.log.Warn("snapshot not used as a pack's base", "snapshot_id", id, "err", err)
		}
		return nil, release
	}
	var files []*os.File
	release = func() {
		for _, f := range files {
			f.Close()
		}
	}
	bases = map[string]chunkstore.Seed{}
	for _, name := range []string{capture.MemFile, capture.DiskFile} {
		mf, ok := m.File(name)
		if !ok {
			release()
			return nil, func() {}
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			release()
			return nil, func() {}
		}
		files = append(files, f)
		if fi, err := f.Stat(); err != nil || fi.Size() != mf.Size {
			release()
			return nil, func() {}
		}
		sd := chunkstore.SeedOf(f.Name(), m.ChunkSize, mf)
		sd.File = f
		bases[name] = sd
	}
	return bases, release
}

// BaseOfPack is the snapshot a pack's header names as its base (""
// for its template).
func BaseOfPack(h chunkstore.PackHeader) (string, error) {
	if h.BaseName == "" {
		return "", nil
	}
	id, ok := strings.CutPrefix(h.BaseName, SnapshotSet(""))
	if !ok || !host.ValidID(id) {
		return "", fmt.Errorf("%w: the pack's base %q is no snapshot", host.ErrInvalid, h.BaseName)
	}
	return id, nil
}

// LineageSeeds adds to seeds (a download's, released by release) this
// host's copy of durable snapshot lineage, if it holds one: the chunks of
// a set derived from it come from there rather than the store.
func (s *Sync) LineageSeeds(ctx context.Context, lineage string, seeds []chunkstore.Seed, release func()) ([]chunkstore.Seed, func()) {
	if lineage == "" {
		return seeds, release
	}
	bases, rel := s.SnapshotBases(ctx, lineage)
	if bases == nil {
		return seeds, release
	}
	return append(seeds, SeedsOf(bases)...), func() { release(); rel() }
}

// SeedsOf are bases as seeds of a receive.
func SeedsOf(bases map[string]chunkstore.Seed) []chunkstore.Seed {
	var out []chunkstore.Seed
	for _, sd := range bases {
		out = append(out, sd)
	}
	return out
}
