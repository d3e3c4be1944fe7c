package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// openChunkStore opens the host agent's chunkstore over objs, its leases
// owned by the data directory (storeOwner), and, with cfg.LazyRestore,
// its lazy restore (a chunk cache in DATA_DIR/store/chunk-cache, shared by
// every lazily restored machine of the host).
func openChunkStore(cfg Config, objs objstore.Store) (*chunkstore.Store, *hostagent.LazyConfig, error) {
	owner, err := storeOwner(cfg.DataDir)
	if err != nil {
		return nil, nil, err
	}
	if !cfg.LazyRestore {
		s, err := chunkstore.New(objs, chunkstore.Config{Owner: owner})
		return s, nil, err
	}
	// In the store volume (made by the agent, after this), so that the
	// capture of a lazily restored machine reflinks its chunks from here.
	cache, err := chunkstore.OpenCache(filepath.Join(cfg.DataDir, "store", hostagent.ChunkCacheDir))
	if err != nil {
		return nil, nil, fmt.Errorf("lazy restore: %w", err)
	}
	// Where the cache was before 2026-12-05: only a cache (gone already:
	// nothing to do).
	os.RemoveAll(filepath.Join(cfg.DataDir, "chunk-cache"))
	s, err := chunkstore.New(objs, chunkstore.Config{Cache: cache, Owner: owner})
	if err != nil {
		return nil, nil, err
	}
	return s, &hostagent.LazyConfig{Chunks: s, Objects: objs, Holder: cfg.LazyHolder}, nil
}

// storeOwnerFile holds the data directory's name among the users of an
// object store (chunkstore.Config.Owner), made on first use: the data
// directory is locked by one process at a time, so the leases a crashed
// process left are this one's to delete.
const storeOwnerFile = "store-owner"

func storeOwner(dataDir string) (string, error) {
	path := filepath.Join(dataDir, storeOwnerFile)
	b, err := os.ReadFile(path)
	if err == nil {
		if owner := strings.TrimSpace(string(b)); owner != "" {
			return owner, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("object store owner: %w", err)
	}
	id := make([]byte, 8)
	rand.Read(id)
	owner := hex.EncodeToString(id)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(owner+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("object store owner: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("object store owner: %w", err)
	}
	return owner, nil
}
