package chunkstore

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// TestManifestChunkSizeBounded: a manifest in the object store whose chunk
// size is over maxChunkSize is refused when read. A download allocates a
// buffer of the chunk size per worker, so one such manifest (1 TiB: one
// small file in one chunk passes every other check) would take the host
// agent down. maxChunkSize itself still reads.
func TestManifestChunkSizeBounded(t *testing.T) {
	t.Parallel() // a store of its own
	ctx := context.Background()
	objs, err := objstore.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, objs)
	hash := "a3f1c09b7e5d4c2f8e6b1a0d9c7e5f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e"
	for _, tc := range []struct {
		chunkSize int64
		ok        bool
	}{{1 << 40, false}, {maxChunkSize + 4096, false}, {maxChunkSize, true}} {
		name := fmt.Sprintf("sets/c%d", tc.chunkSize)
		b := []byte(fmt.Sprintf(`{"version":1,"name":%q,"chunk_size":%d,"files":[{"name":"vm.mem","size":1,"chunks":[%q]}]}`, name, tc.chunkSize, hash))
		if err := objs.Put(ctx, manifestKey(name), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
		_, err := s.Manifest(ctx, name)
		if (err == nil) != tc.ok {
			t.Errorf("manifest of chunk size %d: %v, want accepted %v", tc.chunkSize, err, tc.ok)
		}
	}
}
