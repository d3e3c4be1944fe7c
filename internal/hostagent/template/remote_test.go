package template

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// fakeTemplate writes a sealed template directory key in s's directory,
// its files holding data in their first chunk only, without a bake.
func fakeTemplate(t *testing.T, s *Store, key string) *Template {
	t.Helper()
	dir := filepath.Join(s.cfg.Dir, key)
	os.MkdirAll(dir, 0o700)
	for i, name := range indexedFiles {
		b := make([]byte, 3<<20)
		for j := range 4096 {
			b[j] = byte(i + j)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, metaFile), []byte(`{"name":"x","memory_mib":128,"vcpus":1,"boot_id":"b"}`), 0o600)
	if _, err := manifest.Seal(dir, append(indexedFiles, metaFile)...); err != nil {
		t.Fatal(err)
	}
	tm, ok := s.ByKey(key)
	if !ok {
		t.Fatalf("ByKey(%s) finds no template", key)
	}
	return tm
}

// TestChunkIndex: a template's chunk index is made once, kept in its
// directory, given when an upload or download listed it, and not used
// once its files change.
func TestChunkIndex(t *testing.T) {
	s, err := NewStore(Config{Dir: t.TempDir(), Accel: accel.TCG})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tm := fakeTemplate(t, s, "x-128m-1c")
	if s.HasChunkIndex(tm, 1<<20) {
		t.Fatal("a new template has a chunk index")
	}
	idx, err := s.ChunkIndex(ctx, tm, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	mem := idx.Files["vm.mem"]
	if len(mem.Chunks) != 3 || mem.Chunks[0] == "" || mem.Chunks[1] != "" || mem.Chunks[2] != "" {
		t.Errorf("index of vm.mem: %q, want one data chunk then two zero ones", mem.Chunks)
	}
	if !s.HasChunkIndex(tm, 1<<20) || s.HasChunkIndex(tm, 2<<20) {
		t.Errorf("index of 1 MiB chunks kept: %v; of 2 MiB: %v", s.HasChunkIndex(tm, 1<<20), s.HasChunkIndex(tm, 2<<20))
	}
	got, closeSeeds, err := idx.Open(tm)
	if err != nil || len(got) != 3 || got[0].Path != filepath.Join(tm.Dir, "vm.mem") || got[0].ChunkSize != 1<<20 || got[0].File == nil || !got[0].Current {
		t.Errorf("seeds %+v, %v", got, err)
	}
	closeSeeds()

	// Given by an upload's manifest: kept as is.
	given := idx.Files["vm.mem"]
	given.Chunks = []string{"given", "", ""}
	files := []chunkstore.File{given, idx.Files["vm.state"], idx.Files["rootfs.ext4"]}
	if err := s.SetChunkIndex(tm, 1<<20, files); err != nil {
		t.Fatal(err)
	}
	idx, _ = s.ChunkIndex(ctx, tm, 1<<20)
	if idx.Files["vm.mem"].Chunks[0] != "given" {
		t.Errorf("index after SetChunkIndex: %q", idx.Files["vm.mem"].Chunks)
	}
	if err := s.SetChunkIndex(tm, 1<<20, files[:1]); err == nil {
		t.Error("SetChunkIndex took an index without vm.state and rootfs.ext4")
	}

	// A write to a file: the index is stale, and made again.
	f, _ := os.OpenFile(tm.MemFile(), os.O_WRONLY, 0)
	f.WriteAt([]byte{1}, 2<<20)
	f.Close()
	if s.HasChunkIndex(tm, 1<<20) {
		t.Error("the index outlived a write to vm.mem")
	}
	if _, _, err := idx.Open(tm); err == nil {
		t.Error("a stale index opened its template's files as seeds")
	}
	idx, err = s.ChunkIndex(ctx, tm, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if c := idx.Files["vm.mem"].Chunks; c[0] == "given" || c[2] == "" {
		t.Errorf("index made again: %q, want vm.mem's chunks 0 and 2 hashed", c)
	}
	if _, ok := s.ByKey("../x"); ok {
		t.Error("ByKey took a path")
	}
}
