package chunkstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// Cache is a local directory of chunks fetched from the store, named by
// their hash, shared by every reader of a host: a chunk is fetched once
// however many sandboxes touch it. Chunks are written to a temporary file,
// checked against their hash, flushed and renamed, so several processes
// may share one directory and a crash leaves no torn chunk under a hash
// name. Within a process, concurrent misses of one chunk wait for one
// fetch. Nothing is evicted yet.
type Cache struct {
	dir string

	mu       sync.Mutex
	inflight map[string]*fetchCall

	hits, fetches, bytesFetched atomic.Int64
}

type fetchCall struct {
	done chan struct{}
	err  error
}

// CacheStats counts a Cache's work since it was opened.
type CacheStats struct {
	Hits         int64 // chunks found in the directory
	Fetches      int64 // chunks fetched from the store
	BytesFetched int64
}

// OpenCache opens the cache in dir. dir is made at the first fetch, not
// now: it may be inside a file system mounted later (the agent's store
// volume, so that a chunk can be reflinked into a memory image).
func OpenCache(dir string) (*Cache, error) {
	if dir == "" {
		return nil, errors.New("open chunk cache: no directory")
	}
	return &Cache{dir: dir, inflight: map[string]*fetchCall{}}, nil
}

// Stats returns the counts so far.
func (c *Cache) Stats() CacheStats {
	return CacheStats{Hits: c.hits.Load(), Fetches: c.fetches.Load(), BytesFetched: c.bytesFetched.Load()}
}

func (c *Cache) path(hash string) string { return filepath.Join(c.dir, hash) }

// get makes sure chunk hash (n bytes) is in the cache, fetching it with s
// if not (made from delta d if it is not nil), and returns its path.
func (c *Cache) get(ctx context.Context, s *Store, hash string, n int64, d *Delta) (string, error) {
	p := c.path(hash)
	if fi, err := os.Stat(p); err == nil && fi.Size() == n {
		c.hits.Add(1)
		return p, nil
	}
	c.mu.Lock()
	if call, ok := c.inflight[hash]; ok {
		c.mu.Unlock()
		select {
		case <-call.done:
			return p, call.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	call := &fetchCall{done: make(chan struct{})}
	c.inflight[hash] = call
	c.mu.Unlock()

	call.err = c.fill(ctx, s, hash, n, d)
	c.mu.Lock()
	delete(c.inflight, hash)
	c.mu.Unlock()
	close(call.done)
	return p, call.err
}

func (c *Cache) fill(ctx context.Context, s *Store, hash string, n int64, d *Delta) (err error) {
	buf := make([]byte, n)
	fetched := n
	if d != nil {
		if fetched, err = s.build(ctx, nil, hash, *d, buf); err != nil {
			return err
		}
	} else if err := s.fetch(ctx, hash, buf); err != nil {
		return err
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("chunk cache: %w", err)
	}
	tmp, err := os.CreateTemp(c.dir, ".fetch-*")
	if err != nil {
		return fmt.Errorf("chunk cache: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(buf); err != nil {
		return fmt.Errorf("chunk cache: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("chunk cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("chunk cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), c.path(hash)); err != nil {
		return fmt.Errorf("chunk cache: %w", err)
	}
	c.fetches.Add(1)
	c.bytesFetched.Add(fetched)
	return nil
}

// Reader reads one file of a set, fetching each chunk into the Cache the
// first time it is touched. Safe for concurrent use.
type Reader struct {
	s     *Store
	cache *Cache
	file  File
	csize int64
}

var _ io.ReaderAt = (*Reader)(nil)

// Open returns a reader of file in set name. It reads the manifest now and
// chunks only when read; it needs Config.Cache.
func (s *Store) Open(ctx context.Context, name, file string) (*Reader, error) {
	if s.cfg.Cache == nil {
		return nil, errors.New("open: no chunk cache configured")
	}
	m, err := s.Manifest(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	f, ok := m.File(file)
	if !ok {
		return nil, fmt.Errorf("open %s: no file %q in it: %w", name, file, fs.ErrNotExist)
	}
	return &Reader{s: s, cache: s.cfg.Cache, file: f, csize: m.ChunkSize}, nil
}

// Size is the file's size.
func (r *Reader) Size() int64 { return r.file.Size }

// ReadAt reads with no deadline; see ReadAtContext.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	return r.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext reads len(p) bytes at off (fewer, with io.EOF, at the end
// of the file), fetching the chunks it touches that are not cached.
// Errors of the store keep their class (objstore.ErrUnavailable).
func (r *Reader) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s at %d: negative offset", r.file.Name, off)
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		if pos >= r.file.Size {
			return done, io.EOF
		}
		i := int(pos / r.csize)
		in := pos - int64(i)*r.csize // offset inside the chunk
		n := min(int64(len(p)-done), chunkLen(r.file.Size, r.csize, i)-in)
		dst := p[done : done+int(n)]
		if h := r.file.Chunks[i]; h == "" {
			clear(dst)
		} else if err := r.readChunk(ctx, h, r.delta(i), chunkLen(r.file.Size, r.csize, i), dst, in); err != nil {
			return done, fmt.Errorf("read %s at %d: %w", r.file.Name, pos, err)
		}
		done += int(n)
	}
	return done, nil
}

// ChunkPath returns the path of chunk i of the file in the cache,
// fetching it first if it is not there (a whole file of the chunk's
// length); "" for a chunk of zeros, which is never stored.
func (r *Reader) ChunkPath(ctx context.Context, i int) (string, error) {
	if i < 0 || i >= len(r.file.Chunks) {
		return "", fmt.Errorf("chunk %d of %s: out of range", i, r.file.Name)
	}
	h := r.file.Chunks[i]
	if h == "" {
		return "", nil
	}
	return r.cache.get(ctx, r.s, h, chunkLen(r.file.Size, r.csize, i), r.delta(i))
}

// delta is how chunk i is made if it is a delta (nil: it is stored
// whole).
func (r *Reader) delta(i int) *Delta {
	if d, ok := r.file.Deltas[i]; ok {
		return &d
	}
	return nil
}

func (r *Reader) readChunk(ctx context.Context, hash string, d *Delta, size int64, dst []byte, off int64) error {
	p, err := r.cache.get(ctx, r.s, hash, size, d)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("chunk cache: %w", err)
	}
	defer f.Close()
	if _, err := f.ReadAt(dst, off); err != nil {
		return fmt.Errorf("chunk cache: %s: %w", hash, err)
	}
	return nil
}
