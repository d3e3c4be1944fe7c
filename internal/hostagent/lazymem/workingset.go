package lazymem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// WorkingSet is the list of chunks of a set's memory file that its first
// lazy restore touched, in first-touch order: what the next lazy restore
// prefetches. It is stored as worksets/<set>.json, next to the set's
// manifest (manifests/<set>.json).
type WorkingSet struct {
	Version   int    `json:"version"`
	File      string `json:"file"`       // the set's file it is about ("vm.mem")
	ChunkSize int64  `json:"chunk_size"` // of the set's manifest
	Chunks    []int  `json:"chunks"`
	// Window is how long after the first read the chunks were recorded.
	WindowMS int64 `json:"window_ms"`
}

const workingSetVersion = 1

// WorkingSetKey is the object key of set name's working set.
func WorkingSetKey(name string) string { return "worksets/" + name + ".json" }

// maxWorkingSet bounds what LoadWorkingSet reads: 1 TiB of 2 MiB chunks
// is 512 Ki indices.
const maxWorkingSet = 8 << 20

// SaveWorkingSet stores ws as set name's working set. Nothing removes it
// with the set yet: it is a few KiB, and a later set of the same name
// replaces it.
func SaveWorkingSet(ctx context.Context, objs objstore.Store, name string, ws WorkingSet) error {
	ws.Version = workingSetVersion
	b, err := json.Marshal(ws)
	if err != nil {
		return err
	}
	if err := objs.Put(ctx, WorkingSetKey(name), bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("save working set of %s: %w", name, err)
	}
	return nil
}

// LoadWorkingSet reads set name's working set; objstore.ErrNotFound if
// none was saved.
func LoadWorkingSet(ctx context.Context, objs objstore.Store, name string) (WorkingSet, error) {
	rc, err := objs.Get(ctx, WorkingSetKey(name))
	if err != nil {
		return WorkingSet{}, fmt.Errorf("load working set of %s: %w", name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxWorkingSet))
	if err != nil {
		return WorkingSet{}, fmt.Errorf("load working set of %s: %w", name, err)
	}
	var ws WorkingSet
	if err := json.Unmarshal(b, &ws); err != nil {
		return WorkingSet{}, fmt.Errorf("load working set of %s: %w", name, err)
	}
	if ws.Version != workingSetVersion {
		return WorkingSet{}, fmt.Errorf("load working set of %s: version %d, want %d", name, ws.Version, workingSetVersion)
	}
	return ws, nil
}

// StoreImages resolves sets of a chunkstore: the Resolver of an FS whose
// files are the File (e.g. "vm.mem") of sets in Chunks, with working sets
// kept in Objects (the object store Chunks is over).
type StoreImages struct {
	Chunks  *chunkstore.Store // with a Cache
	Objects objstore.Store
	File    string
	// RecordFor is Image.RecordFor of a set without a working set (0:
	// record nothing).
	RecordFor time.Duration
	// FetchAll is Image.FetchAll.
	FetchAll bool
	// NoPrefetch ignores stored working sets (for measurements).
	NoPrefetch bool
	// OnError, if set, hears of a working set that could not be loaded or
	// saved (the restore goes on without it).
	OnError func(name string, err error)
	// Seeds, if set, returns this host's copies of chunks of set m (its
	// template's files, open; release closes them once the FS closes):
	// chunks of the file they hold are read from there (Image.Local).
	Seeds func(ctx context.Context, m *chunkstore.Manifest) (seeds []chunkstore.Seed, release func())
}

// Resolve implements Resolver.
func (s *StoreImages) Resolve(ctx context.Context, name string) (*Image, error) {
	m, err := s.Chunks.Manifest(ctx, name)
	if err != nil {
		if errors.Is(err, objstore.ErrNotFound) {
			return nil, fmt.Errorf("%w: %w", fs.ErrNotExist, err)
		}
		return nil, err
	}
	f, ok := m.File(s.File)
	if !ok {
		return nil, fmt.Errorf("set %s has no file %s: %w", name, s.File, fs.ErrNotExist)
	}
	r, err := s.Chunks.Open(ctx, name, s.File)
	if err != nil {
		return nil, err
	}
	im := &Image{Source: r, ChunkSize: m.ChunkSize, FetchAll: s.FetchAll}
	im.Stored = make([]bool, len(f.Chunks))
	for i, h := range f.Chunks {
		im.Stored[i] = h != ""
	}
	if s.Seeds != nil {
		im.Local, im.Close = localChunks(ctx, s.Seeds, m, f)
	}
	ws, err := LoadWorkingSet(ctx, s.Objects, name)
	switch {
	case err == nil && ws.ChunkSize == m.ChunkSize && ws.File == s.File:
		if !s.NoPrefetch {
			im.Prefetch = ws.Chunks
		}
	case err == nil || errors.Is(err, objstore.ErrNotFound):
		// None yet (or of another layout): this restore records one.
		if s.RecordFor > 0 {
			im.RecordFor = s.RecordFor
			im.OnRecorded = func(chunks []int) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				ws := WorkingSet{File: s.File, ChunkSize: m.ChunkSize, Chunks: chunks, WindowMS: s.RecordFor.Milliseconds()}
				if err := SaveWorkingSet(ctx, s.Objects, name, ws); err != nil && s.OnError != nil {
					s.OnError(name, err)
				}
			}
		}
	default:
		if s.OnError != nil {
			s.OnError(name, err)
		}
	}
	return im, nil
}

// localChunks finds the chunks of f (of set m) that seeds hold whole: a
// seed's chunk of the same hash (and size) is the same bytes. A delta
// chunk has its own hash too, so it is found if a seed holds it whole.
// Seeds without an open File, or of another chunk size, are not used.
func localChunks(ctx context.Context, seedsOf func(context.Context, *chunkstore.Manifest) ([]chunkstore.Seed, func()), m *chunkstore.Manifest, f chunkstore.File) (map[int]LocalChunk, func()) {
	seeds, release := seedsOf(ctx, m)
	where := map[string]LocalChunk{}
	for _, sd := range seeds {
		if sd.File == nil || sd.ChunkSize != m.ChunkSize {
			continue
		}
		for j, h := range sd.Chunks {
			if h != "" {
				where[h] = LocalChunk{File: sd.File, Off: int64(j) * sd.ChunkSize}
			}
		}
	}
	local := map[int]LocalChunk{}
	for i, h := range f.Chunks {
		if lc, ok := where[h]; ok && h != "" {
			local[i] = lc
		}
	}
	if len(local) == 0 {
		if release != nil {
			release()
		}
		return nil, nil
	}
	return local, release
}
