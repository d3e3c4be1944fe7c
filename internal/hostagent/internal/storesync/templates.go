package storesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Templates in the object store (Config.Store; docs/storage.md).
//
// Every template this host bakes is uploaded in the background as the
// chunkstore set templates/<key> (vm.mem, vm.state, rootfs.ext4; its
// templates.Meta as the set's Meta), and a template this host lacks, or
// holds stale, is fetched from there when the set was baked from the same
// inputs (template.Remote) instead of being baked again. So the hosts of
// a fleet hold the same bytes for a template, which is what makes moving
// a sandbox between them cheap:
//
//   - A capture's upload sends only the chunks the store lacks; those its
//     template shares with it are there already, as templates/<key>.
//   - A host restoring a capture it does not hold (a snapshot, a paused
//     sandbox) takes from its own copy of the template every chunk that
//     copy holds (chunkstore.DownloadSeeded, the template's ChunkIndex as
//     the seed) and fetches only the rest.
//
// The store's copy is the fleet's: hosts that baked a template at the
// same time (each found none in the store) both upload it, but only the
// first manifest to land is written (a conditional put: the others'
// uploads fail with objstore.ErrExists), and a host whose copy differs
// from the store's replaces its own with it (template.Store.Adopt). A
// host checks when it starts, after each bake and upload, before each
// upload of a capture (one read of the manifest) and when it refuses a
// pack made against another copy; on a store that cannot put
// conditionally, the last manifest written wins and these checks
// converge the hosts. A set is not needed to restore anything:
// every capture's manifest lists all its chunks, template chunks
// included, so a host without the template (or with another bake of it)
// fetches them, and garbage collection keeps them while any manifest
// names them. Sets under templates/ are never deleted by the agent; a
// newer bake of the same key replaces the set.

// templateFiles are the files of a template's set.
var templateFiles = []string{capture.MemFile, capture.StateFile, capture.DiskFile}

// Sync is the templates' Remote (template.Config.Remote) of a host with
// an object store.
var _ template.Remote = (*Sync)(nil)

// Fetch downloads the set templates/<key> into dir if its Meta passes
// accept, taking what this host's own copy of the template holds from
// there.
func (s *Sync) Fetch(ctx context.Context, key string, accept func(templates.Meta) bool, dir string) (templates.Meta, *template.ChunkIndex, error) {
	m, err := s.cfg.Store.Manifest(ctx, TemplateSet(key))
	if errors.Is(err, objstore.ErrNotFound) {
		return templates.Meta{}, nil, fmt.Errorf("template %s: %w: not in the object store", key, templates.ErrNotFound)
	}
	if err != nil {
		return templates.Meta{}, nil, err
	}
	var meta templates.Meta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || !accept(meta) {
		return templates.Meta{}, nil, fmt.Errorf("template %s: %w: the object store's copy was baked from other inputs", key, templates.ErrNotFound)
	}
	t0 := time.Now()
	seeds, release := s.TemplateSeeds(ctx, key)
	defer release()
	st, err := s.cfg.Store.DownloadSeeded(ctx, m, dir, seeds)
	if err != nil {
		return templates.Meta{}, nil, err
	}
	s.log.Info("template fetched from the object store", "template", key, "boot_id", meta.BootID, "dur_ms", time.Since(t0).Milliseconds(),
		"chunks_fetched", st.ChunksFetched, "bytes_fetched", st.BytesFetched, "chunks_local", st.ChunksSeeded, "bytes_local", st.BytesSeeded)
	idx := &template.ChunkIndex{ChunkSize: m.ChunkSize, Files: map[string]chunkstore.File{}}
	for _, f := range m.Files {
		idx.Files[f.Name] = f
	}
	return meta, idx, nil
}

// Baked uploads a template this host baked.
func (s *Sync) Baked(t *template.Template) {
	s.StartTemplateSync(t.Key(), true)
}

// TemplateSeeds are this host's copy of template key as seeds of a
// download, open (the caller calls release once done), or none if it has
// no complete copy whose files pass their checksums, or its index cannot
// be made. A download takes what it
// reflinks from a seed on trust: the template's files passed their
// checksums, and its index was made from them as they are (it is tied to
// their fingerprint), so a restore need not read it all again
// (capture.CheckDownloaded).
func (s *Sync) TemplateSeeds(ctx context.Context, key string) (seeds []chunkstore.Seed, release func()) {
	none := func() {}
	t, ok := s.cfg.Templates.ByKey(key)
	if !ok {
		return nil, none
	}
	if err := s.cfg.Templates.Verify(t); err != nil {
		s.log.Warn("template not used to restore a capture", "template", key, "err", err)
		return nil, none
	}
	idx, err := s.cfg.Templates.ChunkIndex(ctx, t, s.ChunkSize())
	if err == nil {
		seeds, release, err = idx.Open(t)
	}
	if err != nil {
		s.log.Warn("template chunk index", "template", key, "err", err)
		return nil, none
	}
	return seeds, release
}

// TemplateBases are this host's copy of template key as the bases of an
// upload of a capture made from it (chunkstore.UploadOptions.Bases), open
// (the caller calls release): its chunks that differ from the template's
// in a few pages are stored as patches. Nil if this host has no complete
// copy.
func (s *Sync) TemplateBases(ctx context.Context, key string) (bases map[string]chunkstore.Seed, release func()) {
	seeds, release := s.TemplateSeeds(ctx, key)
	if len(seeds) == 0 {
		return nil, release
	}
	bases = map[string]chunkstore.Seed{}
	for _, sd := range seeds {
		bases[filepath.Base(sd.Path)] = sd // a capture's files have its template's names
	}
	return bases, release
}

// StartTemplateSync keeps template key in the object store in the
// background (syncTemplate), retried until it succeeds. Unless after, it
// does nothing while a sync of key runs; with after, it runs once that
// one has ended (a new bake must be uploaded even if an upload of the
// one before it runs).
func (s *Sync) StartTemplateSync(key string, after bool) {
	if s.cfg.Store == nil {
		return
	}
	s.Start(TemplateSet(key), KindUpload, "keep template in the object store", after, func(ctx context.Context) error {
		return s.syncTemplate(ctx, key)
	})
}

// StartTemplateFetch fetches template key (of a capture whose machine
// spec is spec) from the object store in the background if this host
// holds no fresh copy of it: a host sent a pack of a capture of a
// template it lacks (transfer's packSeeds) then takes that pack, and the next ones,
// straight from the host that sent it instead of through the store; a
// host that downloaded a capture without its template (a resume
// elsewhere, a create from another host's snapshot) can then send
// captures of that sandbox as what differs from the template (a send
// waits for it: transfer.Transfers.Send). Not after a lazy restore, whose page-ins
// it would compete with: its first send fetches it. It only fetches,
// never bakes: a copy of its own would not be the sender's. A store
// without the template (or a user template deleted since) ends it;
// another failure is logged, and the next pack tries again.
func (s *Sync) StartTemplateFetch(key string, spec vmm.Spec) {
	p, ok := templates.ParamsOfKey(key, spec.MemoryMiB, spec.VCPUs)
	if s.cfg.Store == nil || !ok {
		return
	}
	s.Start(TemplateSet(key), KindFetch, "fetch template", false, func(ctx context.Context) error {
		if t, ok := s.cfg.Templates.ByKey(key); ok && s.cfg.Templates.Fits(t.Meta) {
			return nil
		}
		err := s.ReplicateUserTemplate(ctx, p.Name, nil)
		if err == nil {
			_, err = s.cfg.Templates.Adopt(ctx, p)
		}
		switch {
		case err == nil:
			s.log.Info("template fetched for the captures sent here", "template", key)
		case errors.Is(err, templates.ErrNotFound):
			s.log.Info("template not fetched: the object store holds no copy this host can use", "template", key, "err", err)
		case ctx.Err() == nil:
			// Tried once, not retried: the next pack tries again
			// (a full disk would otherwise be filled again and again).
			s.log.Warn("fetch template for the captures sent here", "template", key, "err", err)
		}
		return nil
	})
}

// syncTemplate makes this host's fresh copy of template key and the
// store's the same: it uploads this host's if the store has none (or a
// stale one), adopts the store's if that is another bake of the same
// inputs, and otherwise makes sure the template's chunk index exists.
func (s *Sync) syncTemplate(ctx context.Context, key string) error {
	t, ok := s.cfg.Templates.ByKey(key)
	if !ok || !s.cfg.Templates.Fits(t.Meta) {
		return nil // nothing fresh to keep
	}
	m, err := s.cfg.Store.Manifest(ctx, TemplateSet(key))
	if errors.Is(err, objstore.ErrNotFound) {
		return s.UploadTemplate(ctx, t, true)
	}
	if err != nil {
		return err
	}
	var meta templates.Meta
	if json.Unmarshal(m.Meta, &meta) != nil || !s.cfg.Templates.Fits(meta) {
		return s.UploadTemplate(ctx, t, false) // the store's copy is stale
	}
	if meta.BootID != t.BootID {
		return s.adoptTemplate(ctx, t, meta)
	}
	s.cfg.Templates.Verify(t) // now, not in the first restore that uses it
	if m.ChunkSize == s.cfg.Store.ChunkSize() && !s.cfg.Templates.HasChunkIndex(t, m.ChunkSize) {
		if err := s.cfg.Templates.SetChunkIndex(t, m.ChunkSize, m.Files); err != nil {
			s.log.Warn("template chunk index", "template", key, "err", err)
		}
	}
	return nil
}

// UploadTemplate stores this host's template t as templates/<key>, then
// adopts the store's copy if another host's upload of the same template
// replaced it meanwhile. With first (the store held none), the manifest
// is written only if there is still none (UploadOptions.IfAbsent): of
// hosts that baked the template at once, the first upload to land is the
// fleet's copy, and the others adopt it at once.
func (s *Sync) UploadTemplate(ctx context.Context, t *template.Template, first bool) error {
	key := t.Key()
	files := map[string]string{}
	for _, f := range templateFiles {
		files[f] = filepath.Join(t.Dir, f)
	}
	meta, err := json.Marshal(t.Meta)
	if err != nil {
		return err
	}
	t0 := time.Now()
	m, st, err := s.cfg.Store.UploadWith(ctx, TemplateSet(key), files, chunkstore.UploadOptions{Meta: meta, IfAbsent: first}, nil)
	lost := errors.Is(err, objstore.ErrExists)
	switch {
	case lost:
		s.log.Info("template: another host's upload of it landed first", "template", key, "boot_id", t.BootID)
	case err != nil:
		return err
	default:
		s.log.Info("template durable in the object store", "template", key, "boot_id", t.BootID, "dur_ms", time.Since(t0).Milliseconds(),
			"chunks", st.ChunksTotal, "chunks_uploaded", st.ChunksUploaded, "chunks_shared", st.ChunksShared,
			"zero_chunks", st.ZeroChunks, "bytes_uploaded", st.BytesUploaded)
		if err := s.cfg.Templates.SetChunkIndex(t, m.ChunkSize, m.Files); err != nil {
			s.log.Warn("template chunk index", "template", key, "err", err)
		}
	}
	now, err := s.cfg.Store.Manifest(ctx, TemplateSet(key))
	if err != nil {
		if lost {
			return err // the sync is retried
		}
		return nil // checked again before the next upload of a capture
	}
	var got templates.Meta
	if json.Unmarshal(now.Meta, &got) == nil && got.BootID != t.BootID && s.cfg.Templates.Fits(got) {
		return s.adoptTemplate(ctx, t, got)
	}
	if lost {
		return fmt.Errorf("template %s: the object store's copy (boot %s) is not one this host can use", key, got.BootID) // the sync is retried: it replaces a stale copy
	}
	return nil
}

// adoptTemplate replaces this host's copy t of a template with the
// store's, another bake of the same inputs (meta).
func (s *Sync) adoptTemplate(ctx context.Context, t *template.Template, meta templates.Meta) error {
	s.log.Info("template: this host's copy differs from the object store's; adopting the store's", "template", t.Key(),
		"boot_id", t.BootID, "store_boot_id", meta.BootID)
	if _, err := s.cfg.Templates.Adopt(ctx, t.Params); err != nil {
		return fmt.Errorf("adopt template %s: %w", t.Key(), err)
	}
	return nil
}

// SyncTemplates, at start, keeps every fresh template of this host in the
// object store (and adopts the store's copies).
func (s *Sync) SyncTemplates() {
	list, err := s.cfg.Templates.List()
	if err != nil {
		return
	}
	for _, t := range list {
		s.StartTemplateSync(t.Key(), false)
	}
}

// packTemplateWait bounds how long a pack waits for this host to fetch
// the template it was made against (a pack's receive).
const packTemplateWait = 30 * time.Second

// AwaitTemplateJob waits for the background job of si's template (a
// fetch, an adoption, an upload), if one runs, for at most
// packTemplateWait, and logs msg with the time waited.
func (s *Sync) AwaitTemplateJob(ctx context.Context, si capture.Info, msg string) {
	j := s.Job(TemplateSet(si.Template))
	if j == nil {
		return
	}
	t0 := time.Now()
	t := time.NewTimer(packTemplateWait)
	defer t.Stop()
	select {
	case <-j.Done():
	case <-t.C:
	case <-ctx.Done():
	}
	s.log.Info(msg, "snapshot_id", si.ID, "template", si.Template, "waited_ms", time.Since(t0).Milliseconds())
}
