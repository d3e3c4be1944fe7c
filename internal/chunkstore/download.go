package chunkstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sync/errgroup"
)

// Download restores the files of set name into dir (made if missing),
// replacing files of the same names, and returns the manifest. Files are
// sparse: a zero chunk, and a zero 4 KiB page inside a chunk, is a hole.
// Each file is written under a temporary name, flushed and renamed, so a
// file of that name is either the old one or complete. Chunks are checked
// against their hashes.
func (s *Store) Download(ctx context.Context, name, dir string) (*Manifest, error) {
	m, err := s.Manifest(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("download: %w", err)
	}
	if err := s.DownloadManifest(ctx, m, dir); err != nil {
		return nil, err
	}
	return m, nil
}

// DownloadManifest is Download of the files m lists (a manifest read
// earlier with Manifest): what the caller read in m.Meta describes exactly
// these files, even if the set was replaced since. A chunk gone from the
// store meanwhile (the set deleted, then garbage collected) fails it with
// objstore.ErrNotFound.
func (s *Store) DownloadManifest(ctx context.Context, m *Manifest, dir string) error {
	if err := m.check(); err != nil {
		return fmt.Errorf("download %s: %w", m.Name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("download %s: %w", m.Name, err)
	}
	for _, f := range m.Files {
		if err := s.downloadFile(ctx, m, f, dir); err != nil {
			return fmt.Errorf("download %s: %s: %w", m.Name, f.Name, err)
		}
	}
	d, err := os.Open(dir)
	if err == nil {
		err = d.Sync()
		d.Close()
	}
	if err != nil {
		return fmt.Errorf("download %s: %w", m.Name, err)
	}
	return nil
}

func (s *Store) downloadFile(ctx context.Context, m *Manifest, f File, dir string) (err error) {
	tmp, err := os.CreateTemp(dir, "."+f.Name+".part-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Truncate(f.Size); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	idx := make(chan int)
	g.Go(func() error {
		defer close(idx)
		for i, h := range f.Chunks {
			if h == "" {
				continue
			}
			select {
			case idx <- i:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range s.cfg.Workers {
		g.Go(func() error {
			buf := make([]byte, m.ChunkSize)
			for i := range idx {
				n := chunkLen(f.Size, m.ChunkSize, i)
				if err := s.fetch(gctx, f.Chunks[i], buf[:n]); err != nil {
					return err
				}
				if err := writeSparse(tmp, buf[:n], int64(i)*m.ChunkSize); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, f.Name))
}

// fetch reads chunk hash, of exactly len(buf) bytes, into buf and checks
// its hash.
func (s *Store) fetch(ctx context.Context, hash string, buf []byte) error {
	rc, err := s.objs.Get(ctx, chunkKey(hash))
	if err != nil {
		return fmt.Errorf("chunk %s: %w", hash, err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, buf); err != nil {
		return fmt.Errorf("chunk %s: %w", hash, err)
	}
	if n, _ := rc.Read(make([]byte, 1)); n > 0 {
		return fmt.Errorf("chunk %s: longer than the %d bytes the manifest says", hash, len(buf))
	}
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != hash {
		return fmt.Errorf("chunk %s: content does not match its hash", hash)
	}
	return nil
}

const pageSize = 4096

// writeSparse writes buf at off, leaving its zero pages unwritten (holes
// in a fresh file).
func writeSparse(f *os.File, buf []byte, off int64) error {
	for i := 0; i < len(buf); {
		for i < len(buf) && isZero(buf[i:min(i+pageSize, len(buf))]) {
			i += pageSize
		}
		j := i
		for j < len(buf) && !isZero(buf[j:min(j+pageSize, len(buf))]) {
			j += pageSize
		}
		if j > i {
			if _, err := f.WriteAt(buf[i:min(j, len(buf))], off+int64(i)); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }
