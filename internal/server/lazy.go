package server

import (
	"fmt"
	"path/filepath"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/chunkstore"
	"github.com/pandastack/pandastack/internal/objstore"
)

// openChunkStore opens the host agent's chunkstore over objs and, with
// cfg.LazyRestore, its lazy restore (a chunk cache in DATA_DIR/chunk-cache,
// shared by every lazily restored machine of the host).
func openChunkStore(cfg Config, objs objstore.Store) (*chunkstore.Store, *agent.LazyConfig, error) {
	if !cfg.LazyRestore {
		s, err := chunkstore.New(objs, chunkstore.Config{})
		return s, nil, err
	}
	cache, err := chunkstore.OpenCache(filepath.Join(cfg.DataDir, "chunk-cache"))
	if err != nil {
		return nil, nil, fmt.Errorf("lazy restore: %w", err)
	}
	s, err := chunkstore.New(objs, chunkstore.Config{Cache: cache})
	if err != nil {
		return nil, nil, err
	}
	return s, &agent.LazyConfig{Chunks: s, Objects: objs}, nil
}
