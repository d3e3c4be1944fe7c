package template

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// Remote holds templates that hosts baked, shared by the hosts of a fleet
// (the host agent implements it over its object store). One bake of a
// template then serves every host: a host fetches it instead of booting a
// guest, and since every host holds the same bytes, captures of sandboxes
// made from it differ from it only where the sandboxes wrote, which is all
// that has to travel between hosts.
type Remote interface {
	// Fetch writes the files of template key (vm.mem, vm.state,
	// rootfs.ext4) into dir, as the remote holds them, if their Meta
	// passes accept, and returns that Meta and the files' chunk hashes
	// (kept as the template's ChunkIndex; nil if unknown). ErrNotFound if
	// the remote holds no template key that accept takes.
	Fetch(ctx context.Context, key string, accept func(templates.Meta) bool, dir string) (templates.Meta, *ChunkIndex, error)
	// Baked tells of a template this store has just baked (not fetched),
	// for the remote to keep. It must not block.
	Baked(t *Template)
}

// fetch fills t.Dir from the Remote with a template of t's inputs.
func (s *Store) fetch(ctx context.Context, t *Template, say func(string, ...any)) (templates.Meta, *ChunkIndex, error) {
	want := t.Meta
	accept := func(m templates.Meta) bool { return fits(want, m) }
	m, idx, err := s.cfg.Remote.Fetch(ctx, t.Key(), accept, t.Dir)
	if err != nil {
		return templates.Meta{}, nil, err
	}
	if !accept(m) {
		return templates.Meta{}, nil, fmt.Errorf("fetch template %s: %w: the remote's copy was baked from other inputs", t.Key(), templates.ErrNotFound)
	}
	for _, f := range indexedFiles {
		if _, err := os.Stat(filepath.Join(t.Dir, f)); err != nil {
			return templates.Meta{}, nil, fmt.Errorf("fetch template %s: %w", t.Key(), err)
		}
	}
	say("fetched template %s (baked by another host, boot %s)", t.Key(), m.BootID)
	return m, idx, nil
}

// fits reports whether got is a template made the way want would be: the
// same parameters, inputs, accelerator, command line and MAC address.
func fits(want, got templates.Meta) bool {
	return got.Params == want.Params && got.Accel == want.Accel && got.Cmdline == want.Cmdline && got.Machine == want.Machine &&
		got.MAC == want.MAC && maps.Equal(got.Inputs, want.Inputs) && got.BootID != ""
}

// Fits reports whether m describes a template this store would make for
// m.Params now (same inputs, accelerator, command line and MAC address):
// one it can use in place of its own.
func (s *Store) Fits(m templates.Meta) bool {
	inputs, err := s.inputs(m.Name)
	if err != nil {
		return false
	}
	return fits(templates.Meta{Params: m.Params, Accel: s.cfg.Accel, Cmdline: s.cmdline(), Machine: vmm.MachineCurrent, Inputs: inputs, MAC: guestnet.GuestMAC}, m)
}

// Adopt replaces template p with the Remote's copy (which must Fit), even
// if the one here is fresh: hosts that baked the same template at the
// same time converge on one copy. Sandboxes running from the old copy
// keep their files. ErrNotFound if the Remote holds no copy that fits.
func (s *Store) Adopt(ctx context.Context, p templates.Params) (*Template, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if s.cfg.Remote == nil {
		return nil, fmt.Errorf("adopt template %s: %w: no remote", p.Key(), templates.ErrNotFound)
	}
	return s.bakeOnce(ctx, p, "another host's copy replaces this host's", nil, fetchOnly)
}

// Verify checks t's files against their checksums, unless they are
// unchanged since they last passed (the same fingerprint).
func (s *Store) Verify(t *Template) error { return s.verify(t) }

// ByKey returns the baked template whose directory is key, complete (its
// files all there), fresh or not; false if there is none.
func (s *Store) ByKey(key string) (*Template, bool) {
	dir := filepath.Join(s.cfg.Dir, key)
	if key == "" || filepath.Base(key) != key || key[0] == '.' {
		return nil, false
	}
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, false
	}
	t := &Template{Dir: dir}
	if json.Unmarshal(b, &t.Meta) != nil || manifest.Check(dir) != nil {
		return nil, false
	}
	return t, true
}

// chunkIndexFile, in a template's directory, caches its ChunkIndex. A
// re-bake replaces the directory and the index with it.
const chunkIndexFile = "chunks.json"

// ChunkIndex lists the chunk hashes of a template's files, as an upload of
// them to a chunkstore with chunks of ChunkSize would (chunkstore.File per
// file name): what makes a template a seed of downloads of captures made
// from it.
type ChunkIndex struct {
	// Fingerprint is the template directory's (manifest.Fingerprint) when
	// the index was made: an index of other files is not used.
	Fingerprint string                     `json:"fingerprint"`
	ChunkSize   int64                      `json:"chunk_size"`
	Files       map[string]chunkstore.File `json:"files"`
}

// indexedFiles are the template files a ChunkIndex covers.
var indexedFiles = []string{"vm.mem", "vm.state", "rootfs.ext4"}

// ChunkIndex returns t's chunk index for chunks of chunkSize, computed the
// first time (reading the files' data once) and kept in t's directory.
func (s *Store) ChunkIndex(ctx context.Context, t *Template, chunkSize int64) (*ChunkIndex, error) {
	fp, err := manifest.Fingerprint(t.Dir)
	if err != nil {
		return nil, fmt.Errorf("chunk index of template %s: %w", t.Key(), err)
	}
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	var idx ChunkIndex
	if b, err := os.ReadFile(filepath.Join(t.Dir, chunkIndexFile)); err == nil && json.Unmarshal(b, &idx) == nil &&
		idx.Fingerprint == fp && idx.ChunkSize == chunkSize {
		return &idx, nil
	}
	idx = ChunkIndex{Fingerprint: fp, ChunkSize: chunkSize, Files: map[string]chunkstore.File{}}
	for _, name := range indexedFiles {
		f, err := chunkstore.HashFile(ctx, filepath.Join(t.Dir, name), chunkSize)
		if err != nil {
			return nil, fmt.Errorf("chunk index of template %s: %w", t.Key(), err)
		}
		f.Name = name
		idx.Files[name] = f
	}
	if err := s.saveChunkIndex(t, &idx); err != nil {
		s.log.Warn("keep a template's chunk index", "template", t.Key(), "err", err)
	}
	return &idx, nil
}

// SetChunkIndex keeps files (a chunkstore manifest's, of t's own files:
// its upload's or its download's) as t's chunk index, sparing a read of
// its files.
func (s *Store) SetChunkIndex(t *Template, chunkSize int64, files []chunkstore.File) error {
	idx := ChunkIndex{ChunkSize: chunkSize, Files: map[string]chunkstore.File{}}
	for _, f := range files {
		idx.Files[f.Name] = f
	}
	return s.setChunkIndex(t, &idx)
}

func (s *Store) setChunkIndex(t *Template, idx *ChunkIndex) error {
	fp, err := manifest.Fingerprint(t.Dir)
	if err != nil {
		return fmt.Errorf("chunk index of template %s: %w", t.Key(), err)
	}
	idx.Fingerprint = fp
	for _, name := range indexedFiles {
		if _, ok := idx.Files[name]; !ok {
			return fmt.Errorf("chunk index of template %s: %w: no %s", t.Key(), templates.ErrInvalid, name)
		}
	}
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	return s.saveChunkIndex(t, idx)
}

func (s *Store) saveChunkIndex(t *Template, idx *ChunkIndex) error {
	b, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	return manifest.WriteFile(filepath.Join(t.Dir, chunkIndexFile), b, 0o600)
}

// Open opens t's files as seeds (chunkstore.Seed, with File set) of a
// download or bases of an upload, checked to be the very files idx was
// made from: a re-bake replacing t meanwhile fails it rather than give
// chunks that are not what idx says. The caller calls close when done.
func (idx *ChunkIndex) Open(t *Template) (seeds []chunkstore.Seed, close func(), err error) {
	var files []*os.File
	close = func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, name := range indexedFiles {
		cf, ok := idx.Files[name]
		if !ok {
			continue
		}
		f, err := os.Open(filepath.Join(t.Dir, name))
		if err != nil {
			close()
			return nil, nil, err
		}
		files = append(files, f)
		seeds = append(seeds, chunkstore.Seed{Path: f.Name(), File: f, ChunkSize: idx.ChunkSize, Chunks: cf.Chunks})
	}
	// The paths may have been replaced between the index and the opens:
	// the files as they are now must be those of the index, and the open
	// ones those files (an inode open here is not reused).
	fp, err := manifest.Fingerprint(t.Dir)
	if err == nil && fp != idx.Fingerprint {
		err = fmt.Errorf("template %s changed since its chunk index was made", t.Key())
	}
	for _, f := range files {
		if err != nil {
			break
		}
		a, aerr := f.Stat()
		b, berr := os.Stat(f.Name())
		if aerr != nil || berr != nil || !os.SameFile(a, b) {
			err = fmt.Errorf("template %s changed while its files were opened", t.Key())
		}
	}
	if err != nil {
		close()
		return nil, nil, err
	}
	for i := range seeds {
		seeds[i].Current = true // the open files are those idx was made from
	}
	return seeds, close, nil
}

// HasChunkIndex reports whether t has a chunk index of chunkSize for its
// files as they are.
func (s *Store) HasChunkIndex(t *Template, chunkSize int64) bool {
	fp, err := manifest.Fingerprint(t.Dir)
	if err != nil {
		return false
	}
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	var idx ChunkIndex
	b, err := os.ReadFile(filepath.Join(t.Dir, chunkIndexFile))
	return err == nil && json.Unmarshal(b, &idx) == nil && idx.Fingerprint == fp && idx.ChunkSize == chunkSize
}
